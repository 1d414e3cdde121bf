"""PNG plots of a result: throughput per row and system, latency p50/p99 per rate and system (matplotlib, Agg)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from sluice.bench.report import ROWS, SYSTEMS, TITLES, cell_value

__all__ = ["write_plots"]

COLORS = {"sluice": "#1f77b4", "nats": "#2ca02c", "rabbitmq": "#ff7f0e", "redis": "#d62728", "activemq": "#9467bd"}


def _systems(result: dict[str, Any]) -> list[str]:
    return [s for s in SYSTEMS if result.get("systems", {}).get(s, {}).get("available")]


def _ms(v: float) -> str:
    return f"{v:.2f}" if v < 10 else f"{v:,.0f}"


def write_plots(result: dict[str, Any], out_dir: Path) -> list[str]:
    """Writes throughput.png and latency.png (and scale.png with a scale table); returns their file names."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = _systems(result)
    written = []
    rows = [(key, label, pick) for key, label, pick in ROWS if not key.startswith("latency")]
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(rows) * max(1, len(systems)) / 2 + 2))
    height = 0.8 / max(1, len(systems))
    for i, s in enumerate(systems):
        values = [cell_value(pick(result["systems"][s])) or 0.0 for _, _, pick in rows]
        ys = [r + i * height for r in range(len(rows))]
        bars = ax.barh(ys, values, height=height, color=COLORS[s], label=TITLES[s])
        for bar, v in zip(bars, values):
            ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {v:,.0f}" if v else " n/a",
                    va="center", fontsize=7)
    ax.set_yticks([r + 0.4 - height / 2 for r in range(len(rows))], [label for _, label, _ in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("messages per second (higher is better)")
    ax.set_title(f"Throughput, {result.get('load', {}).get('messages', 0):,} messages")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_dir / "throughput.png", dpi=110)
    plt.close(fig)
    written.append("throughput.png")

    rates = [str(r) for r in result.get("load", {}).get("latency_rates", [])]
    fig, axes = plt.subplots(1, max(1, len(rates)), figsize=(5 * max(1, len(rates)), 4), squeeze=False)
    for ax, rate in zip(axes[0], rates):
        names, p50, p99 = [], [], []
        for s in systems:
            d = (result["systems"][s].get("latency") or {}).get(rate)
            if isinstance(d, dict) and "p50_ms" in d and "error" not in d:
                names.append(TITLES[s])
                p50.append(d["p50_ms"])
                p99.append(d["p99_ms"])
        xs = range(len(names))
        ax.bar([x - 0.2 for x in xs], p50, width=0.4, label="p50", color="#1f77b4")
        ax.bar([x + 0.2 for x in xs], p99, width=0.4, label="p99", color="#ff7f0e")
        for x, a, b in zip(xs, p50, p99):
            ax.text(x - 0.2, a, _ms(a), ha="center", va="bottom", fontsize=7)
            ax.text(x + 0.2, b, _ms(b), ha="center", va="bottom", fontsize=7)
        ax.set_xticks(list(xs), names, fontsize=8, rotation=15)
        ax.set_yscale("log")
        ax.set_ylabel("ms, log scale (lower is better)")
        ax.set_title(f"Latency at {int(rate):,} msgs/s, region = 'eu'")
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_dir / "latency.png", dpi=110)
    plt.close(fig)
    written.append("latency.png")

    scale = [r for r in result.get("scale") or [] if not r.get("error")]
    if scale:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
        for n in sorted({r["messages"] for r in scale}):
            pts = sorted((r["groups"], r) for r in scale if r["messages"] == n)
            g = [p[0] for p in pts]
            a1.plot(g, [p[1].get("drain_matched_per_s", 0) for p in pts], marker="o", label=f"{n:,} msgs")
            a2.plot(g, [p[1].get("broker_rss_bytes", 0) / 2**20 for p in pts], marker="o", label=f"{n:,} msgs")
        a1.set_xscale("log")
        a2.set_xscale("log")
        a1.set_xlabel("SQL92 groups")
        a2.set_xlabel("SQL92 groups")
        a1.set_ylabel("matched msgs/s, all groups")
        a2.set_ylabel("broker RSS, MiB")
        a1.set_title("Scale: drain throughput")
        a2.set_title("Scale: broker memory")
        a1.legend(fontsize=8)
        a2.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out_dir / "scale.png", dpi=110)
        plt.close(fig)
        written.append("scale.png")
    return written
