"""The HTML report: one self-contained page, its charts inline SVG drawn by matplotlib.

(Not named html.py: spark-submit runs pipeline.py with this folder first on sys.path,
where that name would hide the standard library's html module.)
"""

from __future__ import annotations

import html
import io
from typing import Any

_STYLE = """
body { font-family: system-ui, -apple-system, Segoe UI, sans-serif; margin: 2rem auto;
       max-width: 1100px; color: #1f2933; }
h1 { font-size: 1.6rem; } h2 { font-size: 1.2rem; margin-top: 2.2rem; }
.cards { display: flex; gap: 1rem; flex-wrap: wrap; }
.card { border: 1px solid #d9e2ec; border-radius: 8px; padding: .8rem 1.2rem; min-width: 9rem; }
.card b { display: block; font-size: 1.5rem; }
.card span { color: #52606d; font-size: .85rem; }
table { border-collapse: collapse; margin-top: .6rem; font-size: .9rem; }
th, td { border-bottom: 1px solid #e4e7eb; padding: .3rem .8rem; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.empty { color: #7b8794; }
svg { max-width: 100%; height: auto; }
"""


def _svg(draw: Any) -> str:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, axes = plt.subplots(figsize=(10, 3.6))
    try:
        draw(axes)
        figure.tight_layout()
        buffer = io.StringIO()
        figure.savefig(buffer, format="svg")
    finally:
        plt.close(figure)
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def _throughput(rows: list[dict[str, Any]]) -> str:
    minutes = sorted({r["minute"] for r in rows})
    index = {m: i for i, m in enumerate(minutes)}
    topics = sorted({r["topic"] for r in rows})

    def draw(axes: Any) -> None:
        for topic in topics[:12]:
            series = [0] * len(minutes)
            for r in rows:
                if r["topic"] == topic:
                    series[index[r["minute"]]] = r["messages"]
            # One minute of data is a single point, which a line alone does not draw.
            marker = "o" if len(minutes) == 1 else None
            axes.plot(range(len(minutes)), series, label=topic, linewidth=1.4, marker=marker)
        step = max(1, len(minutes) // 8)
        axes.set_xticks(range(0, len(minutes), step))
        axes.set_xticklabels(minutes[::step], rotation=20, fontsize=8)
        axes.set_ylabel("completed per minute")
        axes.legend(fontsize=8, loc="upper right")
        axes.grid(alpha=0.3)

    return _svg(draw)


def _bars(labels: list[str], values: list[float], ylabel: str, horizontal: bool = False) -> str:
    def draw(axes: Any) -> None:
        if horizontal:
            axes.barh(range(len(labels)), values, color="#c0392b")
            axes.set_yticks(range(len(labels)))
            axes.set_yticklabels(labels, fontsize=8)
            axes.invert_yaxis()
            axes.set_xlabel(ylabel)
        else:
            axes.bar(range(len(labels)), values, color="#2f80ed")
            axes.set_xticks(range(len(labels)))
            axes.set_xticklabels(labels, rotation=20, fontsize=8)
            axes.set_ylabel(ylabel)
        axes.grid(alpha=0.3)

    return _svg(draw)


def _latency(rows: list[dict[str, Any]]) -> str:
    shown = rows[:15]

    def draw(axes: Any) -> None:
        width = 0.27
        for offset, (key, colour) in enumerate(
            (("p50_s", "#27ae60"), ("p95_s", "#f2994a"), ("p99_s", "#c0392b"))
        ):
            axes.bar(
                [i + (offset - 1) * width for i in range(len(shown))],
                [r[key] or 0 for r in shown],
                width,
                label=key.replace("_s", ""),
                color=colour,
            )
        axes.set_xticks(range(len(shown)))
        axes.set_xticklabels([r["topic"] for r in shown], rotation=20, fontsize=8)
        axes.set_ylabel("seconds, enqueued to finished")
        axes.legend(fontsize=8)
        axes.grid(alpha=0.3)

    return _svg(draw)


def _table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return '<p class="empty">No data.</p>'
    head = "".join(f"<th>{html.escape(str(k))}</th>" for k in rows[0])
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_cell(v))}</td>" for v in row.values()) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def render_html(
    tables: dict[str, list[dict[str, Any]]], summary: dict[str, Any], *, title: str
) -> str:
    """The whole report page."""
    shown = dict(summary)
    if isinstance(shown.get("dlq_rate"), float):
        shown["dlq_rate"] = f"{shown['dlq_rate']:.2%}"
    cards = "".join(
        f'<div class="card"><b>{html.escape(_cell(shown.get(key)))}</b>'
        f"<span>{html.escape(label)}</span></div>"
        for key, label in (
            ("completed", "completed"),
            ("dead", "dead letters"),
            ("dlq_rate", "dead-letter rate"),
            ("latency_p50_s", "latency p50 (s)"),
            ("latency_p95_s", "latency p95 (s)"),
            ("latency_p99_s", "latency p99 (s)"),
            ("topics", "topics"),
        )
    )
    sections = [f"<h1>{html.escape(title)}</h1>", f'<div class="cards">{cards}</div>']
    throughput = tables.get("throughput", [])
    sections.append("<h2>Throughput per minute</h2>")
    sections.append(_throughput(throughput) if throughput else '<p class="empty">No data.</p>')
    latency = [r for r in tables.get("latency", []) if r["topic"] != "(all)"]
    sections.append("<h2>End-to-end latency</h2>")
    if latency:
        sections.append(_latency(latency))
    sections.append(_table(tables.get("latency", [])))
    attempts = tables.get("attempts", [])
    sections.append("<h2>Attempts</h2>")
    if attempts:
        sections.append(
            _bars(
                [f"{r['attempts']} ({r['outcome']})" for r in attempts],
                [r["messages"] for r in attempts],
                "messages",
            )
        )
    sections.append(_table(attempts))
    rates = tables.get("dlq_rate", [])
    sections.append("<h2>Dead-letter rate per topic</h2>")
    if rates:
        sections.append(
            _bars([r["topic"] for r in rates], [r["dlq_rate"] for r in rates], "dead / finished")
        )
    sections.append(_table(rates))
    reasons = tables.get("failure_reasons", [])
    sections.append("<h2>Top failure reasons</h2>")
    if reasons:
        sections.append(
            _bars(
                [
                    r["reason"][:60] + (f" ({r['error_type']})" if r["error_type"] else "")
                    for r in reasons
                ],
                [r["messages"] for r in reasons],
                "dead letters",
                horizontal=True,
            )
        )
    sections.append(_table(reasons))
    body = "\n".join(sections)
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head>"
        f"<body>{body}</body></html>\n"
    )
