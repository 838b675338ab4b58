"""Results: one JSON document (everything, machine-readable) and one Markdown page (the
tables a reader wants, with sqlbroker ÷ floor ratios)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from harness import CaseResult, Sizes
from systems import PEERS
from workloads import WORKLOADS

FLOOR = "floor"
SUBJECT = "sqlbroker"


def _medians(results: list[CaseResult]) -> dict[tuple[str, str, str], dict[str, float]]:
    return {
        (r.system, r.target, r.workload): {k: s.median for k, s in r.summary().items()}
        for r in results
        if r.samples
    }


def ratios(results: list[CaseResult]) -> list[dict[str, Any]]:
    """sqlbroker's median ÷ a reference median, per target, workload and metric: the floor's
    (``versus: floor``), the best peer's in the same target (``versus: best peer``, naming
    it) and, for a feature's cost, sqlbroker's own baseline workload (``versus: baseline``).

    For throughput above 1 is faster than the reference; for latency above 1 is slower.
    """
    medians = _medians(results)
    found = []

    def add(key: tuple[str, str, str], versus: str, ref: tuple[str, str, str]) -> None:
        target, workload = key[1], key[2]
        ours, theirs = medians[key], medians[ref]
        for metric in WORKLOADS[workload].metrics:
            if metric in ours and theirs.get(metric):
                found.append(
                    {
                        "target": target,
                        "workload": workload,
                        "metric": metric,
                        "versus": versus,
                        "reference": f"{ref[0]}:{ref[2]}",
                        "sqlbroker": round(ours[metric], 3),
                        "other": round(theirs[metric], 3),
                        "ratio": round(ours[metric] / theirs[metric], 3),
                    }
                )

    for key in medians:
        system, target, workload = key
        info = WORKLOADS.get(workload)
        if system != SUBJECT or info is None:
            continue
        if info.reference is not None and (FLOOR, target, info.reference) in medians:
            add(key, "floor", (FLOOR, target, info.reference))
        if info.baseline is not None and (SUBJECT, target, info.baseline) in medians:
            add(key, "baseline", (SUBJECT, target, info.baseline))
        peer_workload = info.peer_reference or workload
        candidates = [
            k for k in medians if k[0] in PEERS and k[1] == target and k[2] == peer_workload
        ]
        if candidates:
            metric = info.metrics[-1]
            pick = max if info.higher_is_better else min
            best = pick(candidates, key=lambda k: medians[k].get(metric, 0.0))
            add(key, "best peer", best)
    return found


def build_report(
    *,
    results: list[CaseResult],
    sizes: Sizes,
    machine: dict[str, Any],
    targets: dict[str, Any],
    duration: float,
    command: str,
    max_noise: float,
) -> dict[str, Any]:
    return {
        "format": 1,
        "mode": sizes.mode,
        "command": command,
        "max_noise": max_noise,
        "duration_s": round(duration, 1),
        "machine": machine,
        "targets": targets,
        "sizes": sizes.__dict__,
        "workloads": {
            name: {"unit": w.unit, "metrics": list(w.metrics), "summary": w.summary}
            for name, w in WORKLOADS.items()
        },
        "results": [r.to_json() for r in results],
        "ratios": ratios(results),
    }


def _number(value: float, unit: str) -> str:
    if unit == "ms":
        return f"{value:.1f}" if value < 100 else f"{value:,.0f}"
    return f"{value:,.0f}"


def _cell(result: dict[str, Any] | None, metric: str, unit: str) -> str:
    if result is None:
        return "—"
    if result["error"]:
        return "failed"
    stats = result["metrics"].get(metric)
    if stats is None:
        return "—"
    low, high = _number(stats["min"], unit), _number(stats["max"], unit)
    return f"**{_number(stats['median'], unit)}** ({low}–{high})"


DIAGNOSTICS = {
    "publish.single": ("send_p50_ms", "send_p99_ms"),
    "drain.runtime": (
        "claim_calls",
        "claim_mean_rows",
        "claim_mean_ms",
        "complete_calls",
        "complete_mean_rows",
        "complete_mean_ms",
        "idle_detection_and_shutdown_s",
    ),
    "drain.claim10": ("claim_mean_ms", "claim_p99_ms", "complete_mean_ms", "complete_p99_ms"),
    "drain.claim100": ("claim_mean_ms", "claim_p99_ms", "complete_mean_ms", "complete_p99_ms"),
    "latency": ("after_commit_p50_ms", "after_commit_p99_ms", "achieved_rate"),
}


def _diagnostics(results: list[dict[str, Any]]) -> list[str]:
    """One line per case with the details that explain its number (call counts and sizes,
    per-call times, latency once the publish has committed)."""
    lines = []
    for r in results:
        keys = DIAGNOSTICS.get(r["workload"], ())
        found = []
        for key in keys:
            values = [d[key] for d in r["details"] if key in d]
            if values:
                found.append(f"{key} {statistics.median(values):g}")
        if found:
            lines.append(f"- `{r['workload']}` {r['system']} {r['target']}: " + ", ".join(found))
    return lines


TARGETS = (
    # (label, target, workload, metric, versus, bound, at_least)
    ("W1 single ≥ 0.9× floor", "postgresql", "publish.single", "rate", "floor", 0.9, True),
    ("W1 batch ≥ 0.9× floor", "postgresql", "publish.batch", "rate", "floor", 0.9, True),
    ("W2 claim 10 ≥ 0.8× floor", "postgresql", "drain.claim10", "rate", "floor", 0.8, True),
    ("W2 claim 10 ≥ 2× best peer", "postgresql", "drain.claim10", "rate", "best peer", 2, True),
    ("W2 claim 100 ≥ 0.8× floor", "postgresql", "drain.claim100", "rate", "floor", 0.8, True),
    (
        "W2 claim 100 ≥ 2× best peer",
        "postgresql",
        "drain.claim100",
        "rate",
        "best peer",
        2,
        True,
    ),
    ("W3 p99 ≤ 1.5× floor", "postgresql", "latency", "p99", "floor", 1.5, False),
)
"""Issue 6's targets that are ratios in one run (sqlbroker with its defaults, PostgreSQL)."""


def target_checks(report: dict[str, Any]) -> list[str]:
    """One line per issue-6 target found in this run: the ratio and whether it is met."""
    ratio_of = {(q["target"], q["workload"], q["metric"], q["versus"]): q for q in report["ratios"]}
    lines = []
    for label, target, workload, metric, versus, bound, at_least in TARGETS:
        found = ratio_of.get((target, workload, metric, versus))
        if found is None:
            continue
        met = found["ratio"] >= bound if at_least else found["ratio"] <= bound
        against = found["reference"] if versus != "floor" else "floor"
        lines.append(
            f"- {label}: **{found['ratio']:.2f}×** ({against}) — {'met' if met else 'missed'}"
        )
    medians = {
        (r["target"], r["workload"]): r["metrics"] for r in report["results"] if r["metrics"]
    }
    for series, what in (("claim.backlog.", ""), ("claim.backlog.keyed.", ", ordering keys")):
        small = medians.get(("postgresql", f"{series}10k"))
        for label in ("100k", "1m"):
            large = medians.get(("postgresql", f"{series}{label}"))
            if small and large:
                ratio = large["p99"]["median"] / small["p99"]["median"]
                met = "met" if ratio <= 2 else "missed"
                lines.append(
                    f"- W4 claim p99 at {label} ÷ at 10k ≤ 2{what}: **{ratio:.2f}×** (sqlbroker)"
                    f" — {met}"
                )
    return lines


def _target_table(
    target: str, results: list[dict[str, Any]], ratios: list[dict[str, Any]]
) -> list[str]:
    """One table per target: a column per system, then sqlbroker's ratios."""
    columns = []
    for r in results:
        if r["target"] == target and r["system"] not in columns:
            columns.append(r["system"])
    if not columns:
        return []
    by_key = {(r["system"], r["workload"]): r for r in results if r["target"] == target}
    ratio_of = {
        (q["workload"], q["metric"], q["versus"]): q for q in ratios if q["target"] == target
    }
    kinds = [v for v in ("floor", "best peer", "baseline") if any(k[2] == v for k in ratio_of)]
    header = ["workload", "metric", *columns, *(f"sqlbroker ÷ {v}" for v in kinds)]
    lines = [f"### {target}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, info in WORKLOADS.items():
        if not any(key[1] == name for key in by_key):
            continue
        for metric in info.metrics:
            label = f"{metric} {info.unit}" if len(info.metrics) > 1 else info.unit
            row = [f"`{name}`", label]
            row += [_cell(by_key.get((system, name)), metric, info.unit) for system in columns]
            for versus in kinds:
                found = ratio_of.get((name, metric, versus))
                if found is None:
                    row.append("—")
                elif versus == "floor":
                    row.append(f"{found['ratio']:.2f}×")
                else:
                    other = found["reference"].replace(":", " `") + "`"
                    row.append(f"{found['ratio']:.2f}× ({other})")
            lines.append("| " + " | ".join(row) + " |")
    return [*lines, ""]


def render_markdown(report: dict[str, Any]) -> str:
    machine = report["machine"]
    results = report["results"]

    lines = [
        f"# sqlbroker benchmark — {report['mode']} run",
        "",
        f"{machine['date']} · commit `{(machine['git_commit'] or '?')[:12]}`"
        + (" (uncommitted changes)" if machine.get("git_dirty") else "")
        + f" · `{report['command']}` · {report['duration_s']:.0f} s",
        "",
        f"Machine: {machine['cpu_model']}, {machine['cpu_cores']} cores, "
        f"{machine['ram_gib']} GiB RAM · Python {machine['python']} · "
        f"SQLite {machine['sqlite']} · psycopg {machine['psycopg']}"
        + "".join(
            f" · PostgreSQL {t['server_version']}"
            for t in report["targets"].values()
            if t.get("backend") == "postgresql"
        )
        + f" · fsync probe {machine['fsync_probe_ms']} ms · payload {machine['payload_bytes']} B",
        "",
        "Peers (from the package index, in their own environment `bench/.peers-venv`): "
        + (
            ", ".join(f"{name} {version}" for name, version in machine.get("peers", {}).items())
            or "not run"
        ),
        "",
        "Durable settings: PostgreSQL `fsync`, `synchronous_commit` and `full_page_writes` on "
        "(`postgresql-async`, in full runs: `synchronous_commit` off for every contender); "
        "SQLite WAL with `synchronous` FULL (and NORMAL in full runs, huey alike). "
        f"Each cell: **median** (min–max) of {report['sizes']['repeats']} runs, "
        "each on a fresh database. 2 shared cores: treat differences under ~15 % as noise.",
        "",
    ]
    noise = [d["other_cpu_pct"] for r in results for d in r["details"] if "other_cpu_pct" in d]
    steal = [d["steal_pct"] for r in results for d in r["details"] if "steal_pct" in d]
    if noise:
        lines += [
            f"Noise: other processes used a median {statistics.median(noise):.0f} % (max "
            f"{max(noise):.0f} %) of the machine's CPU during the samples; hypervisor steal "
            f"max {max(steal):.0f} %. Repetitions above {report['max_noise']:g} % were "
            "measured again.",
            "",
        ]
    checks = target_checks(report)
    if checks:
        lines += ["## Issue 6 targets in this run", "", *checks, ""]
    lines += ["## Results", ""]
    for target in report["targets"]:
        lines += _target_table(target, results, report["ratios"])
    lines += [
        "",
        "Ratios divide sqlbroker's median by the other's: for throughput below 1 means "
        "sqlbroker is slower, for latency above 1 means it is slower. *÷ best peer* takes the "
        "best peer in the same target (named); *÷ baseline* divides by sqlbroker's own "
        "workload without the feature (what the feature costs). `drain.runtime` is compared "
        "with the 4-consumer claim-10 loop of the floor and the peers' claim-10 drains (their "
        "workers, for pgqueuer, procrastinate and huey).",
        "",
        "## Workloads",
        "",
    ]
    sizes = report["sizes"]
    present = {r["workload"] for r in results}
    for name, info in WORKLOADS.items():
        if name in present:
            lines.append(f"- `{name}` ({info.unit or 'see metrics'}): {info.summary}.")
    lines += [
        "",
        f"Sizes: publish.single {sizes['publish_single']:,} messages, publish.batch "
        f"{sizes['publish_batch']:,} in batches of {sizes['batch_size']}, drains "
        f"{sizes['drain']:,} pre-published messages, latency {sizes['latency_rate']:g} msg/s "
        f"for {sizes['latency_seconds']:g} s.",
        "",
    ]
    diagnostics = _diagnostics(results)
    if diagnostics:
        lines += ["## Where the time goes (medians of per-run details)", "", *diagnostics, ""]
    failures = [r for r in results if r["error"]]
    if failures:
        lines += ["## Failures", ""]
        lines += [
            f"- {r['system']} {r['target']} `{r['workload']}`: {r['error']}" for r in failures
        ]
        lines.append("")
    return "\n".join(lines)


def write(report: dict[str, Any], out_dir: Path) -> list[Path]:
    """Write ``latest.json`` / ``latest.md`` and the same under the run's mode name
    (``quick.*`` or ``default.*``) so that a quick run does not erase a full one."""
    out_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(report, indent=2) + "\n"
    page = render_markdown(report)
    written = []
    for stem in ("latest", report["mode"]):
        for suffix, content in ((".json", text), (".md", page)):
            path = out_dir / f"{stem}{suffix}"
            path.write_text(content)
            written.append(path)
    return written
