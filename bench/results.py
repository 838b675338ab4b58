"""Results: one JSON document (everything, machine-readable) and one Markdown page (the
tables a reader wants, with sqlbroker ÷ floor ratios)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from harness import CaseResult, Sizes
from workloads import WORKLOADS

FLOOR = "floor"
SUBJECT = "sqlbroker"


def ratios(results: list[CaseResult]) -> list[dict[str, Any]]:
    """sqlbroker's median ÷ the floor's median, per PostgreSQL workload and metric.

    For throughput above 1 is faster than the floor (expect below 1); for latency above 1
    is slower.
    """
    by_key = {(r.system, r.target, r.workload): r for r in results if r.samples}
    found = []
    for (system, target, workload), result in by_key.items():
        info = WORKLOADS.get(workload)
        if system != SUBJECT or info is None or info.reference is None:
            continue
        floor = by_key.get((FLOOR, target, info.reference))
        if floor is None:
            continue
        ours, theirs = result.summary(), floor.summary()
        for metric in info.metrics:
            if metric in ours and metric in theirs and theirs[metric].median:
                found.append(
                    {
                        "target": target,
                        "workload": workload,
                        "reference": f"{FLOOR}:{info.reference}",
                        "metric": metric,
                        "sqlbroker": round(ours[metric].median, 3),
                        "floor": round(theirs[metric].median, 3),
                        "ratio": round(ours[metric].median / theirs[metric].median, 3),
                    }
                )
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


def render_markdown(report: dict[str, Any]) -> str:
    machine = report["machine"]
    results = report["results"]
    columns: list[tuple[str, str]] = []
    for r in results:
        if (r["system"], r["target"]) not in columns:
            columns.append((r["system"], r["target"]))
    by_key = {(r["system"], r["target"], r["workload"]): r for r in results}
    ratio_of = {(q["target"], q["workload"], q["metric"]): q for q in report["ratios"]}
    ratio_targets = sorted({q["target"] for q in report["ratios"]})

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
        "Durable settings everywhere: PostgreSQL `fsync`, `synchronous_commit` and "
        "`full_page_writes` on; SQLite WAL with `synchronous` FULL (and NORMAL for comparison). "
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
    header = ["workload", "metric"] + [f"{system} {target}" for system, target in columns]
    header += [f"sqlbroker ÷ floor ({target})" for target in ratio_targets]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, info in WORKLOADS.items():
        if not any(key[2] == name for key in by_key):
            continue
        for metric in info.metrics:
            label = f"{metric} {info.unit}" if len(info.metrics) > 1 else info.unit
            row = [f"`{name}`", label]
            row += [
                _cell(by_key.get((system, target, name)), metric, info.unit)
                for system, target in columns
            ]
            for target in ratio_targets:
                found = ratio_of.get((target, name, metric))
                row.append(f"{found['ratio']:.2f}×" if found else "—")
            lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        "Throughput ratios below 1 mean sqlbroker is slower than the raw-SQL floor; latency "
        "ratios above 1 mean it is slower. `drain.runtime` is compared with the floor's "
        "4-thread claim-10 loop.",
        "",
        "## Workloads",
        "",
    ]
    sizes = report["sizes"]
    for name, info in WORKLOADS.items():
        lines.append(f"- `{name}` ({info.unit}): {info.summary}.")
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
