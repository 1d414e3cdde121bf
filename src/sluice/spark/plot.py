"""``sluice spark stats --plot FILE.png``: the stats result as a picture (matplotlib, the ``plot`` extra).

Top row: messages per second over the store's time span, one line per topic (the busiest
MAX_TOPICS). Bottom row: the most frequent tags and property values of the busiest topic, as
horizontal bars. matplotlib is imported here only, with the Agg backend (no display needed).
"""
from __future__ import annotations

import datetime as dt
from pathlib import Path

from sluice.errors import InvalidParameterError

#: Topics drawn in the rate panel (the busiest ones; a legend beyond this is unreadable).
MAX_TOPICS = 8
#: Bar panels under the rate panel: the busiest topic's tags, then its most counted properties.
MAX_BAR_PANELS = 3


def _matplotlib():
    try:
        import matplotlib
    except ImportError:
        raise InvalidParameterError("--plot needs matplotlib: pip install 'sluice[plot]'") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _bar_panels(result: dict[str, dict], top: int) -> list[tuple[str, dict[str, int]]]:
    """(title, value → count) for the busiest topic: its tags, then the properties counting most."""
    name = max(result, key=lambda t: result[t]["messages"])
    panels = []
    if result[name]["tags"]:
        panels.append((f"{name}: tags", result[name]["tags"]))
    props = sorted(result[name]["properties"].items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))
    panels += [(f"{name}: property {p}", values) for p, values in props]
    return [(title, dict(sorted(values.items(), key=lambda kv: (-kv[1], kv[0]))[:top]))
            for title, values in panels[:MAX_BAR_PANELS]]


def plot_stats(result: dict[str, dict], path: str | Path, *, top: int = 8) -> Path:
    """Draw ``stats()``'s result into the PNG ``path``; returns the path written."""
    if not result:
        raise InvalidParameterError("nothing to plot: the store holds no messages for the topics asked")
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise InvalidParameterError(f"--plot writes a PNG: {path} should end in .png")
    plt = _matplotlib()
    import matplotlib.dates as mdates
    bars = _bar_panels(result, top)
    cols = max(1, len(bars))
    fig = plt.figure(figsize=(max(10, 4.2 * cols), 8.5), layout="constrained")
    grid = fig.add_gridspec(2, cols, height_ratios=[1, 1.15])
    ax = fig.add_subplot(grid[0, :])
    busiest = sorted(result, key=lambda t: -result[t]["messages"])[:MAX_TOPICS]
    for name in busiest:
        tl = result[name].get("timeline")
        if not tl:
            continue
        width = tl["bucket_seconds"]
        # one more edge than buckets, so the last bucket is drawn as wide as the others
        xs = [dt.datetime.fromtimestamp((tl["start_ms"] + i * width * 1000) / 1000, dt.UTC)
              for i in range(len(tl["counts"]) + 1)]
        rates = [c / width for c in tl["counts"]]
        ax.plot(xs, [*rates, rates[-1]], drawstyle="steps-post", linewidth=1.6,
                label=f"{name} ({result[name]['messages']:,} messages)")
    ax.set_title("Messages stored per second (UTC)")
    ax.set_ylabel("messages / s")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize="small")
    locator = mdates.AutoDateLocator(tz=dt.UTC)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=dt.UTC))
    for i, (title, values) in enumerate(bars):
        bx = fig.add_subplot(grid[1, i])
        labels = [v if len(v) <= 24 else v[:23] + "…" for v in values]
        bx.barh(labels[::-1], list(values.values())[::-1], color="tab:blue")
        bx.set_title(title, fontsize="medium")
        bx.set_xlabel("messages")
        bx.grid(axis="x", alpha=0.3)
        for y, count in enumerate(list(values.values())[::-1]):
            bx.annotate(f"{count:,}", (count, y), xytext=(3, 0), textcoords="offset points", va="center",
                        fontsize="small")
        bx.margins(x=0.18)
    fig.suptitle("sluice spark stats", fontsize="large")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
