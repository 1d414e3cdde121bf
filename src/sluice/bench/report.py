"""The result of a run as a Markdown report: the machine, the load, the table (rows × systems, with the change
from the previous result in the same directory), how each system filters and persists, the benchmark scripts."""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

__all__ = ["HOW", "ROWS", "SYSTEMS", "Row", "cell_value", "render_markdown", "table_rows"]

#: Column order; the peers' names as ``--peers`` takes them.
SYSTEMS = ("sluice", "nats", "rabbitmq", "redis", "activemq")
TITLES = {"sluice": "Sluice", "nats": "NATS JetStream", "rabbitmq": "RabbitMQ", "redis": "Redis streams",
          "activemq": "ActiveMQ"}

#: How each system filters and persists, stated in every report so the table is read for what it compares.
HOW = {
    "sluice": "Sluice filters on the broker: tags on the consume-queue units, SQL92 with per-group bitmaps built at "
              "dispatch for groups subscribed before the writes, and by evaluating the selector at pull time for a "
              "group that subscribes later; messages are in the commit log (mmap) before the ack, fsynced by the "
              "flush service (async) or before the ack under `--flush sync`. Client: the SDK (`send_batch` of 32 "
              "from 4 threads, push consumers).",
    "nats": "NATS JetStream filters on subjects (`bench.<tag>.<region>.<a>`): the tag and region drains are "
            "server-side subject filters on a pull consumer, but a subject cannot express `a >= 50`, so the SQL92 "
            "drain takes `region = 'eu'` from the server and tests `a` in the client. File storage; JetStream "
            "fsyncs its files on a timer, not before each ack. Client: nats-py, async "
            "publishes with acks, 32 in flight per task, 4 tasks.",
    "rabbitmq": "RabbitMQ routes at publish time: a topic exchange (routing key `<tag>.<region>.<a>`) feeds the tag "
                "and region queues, and a headers exchange bound to it feeds the SQL92 queue through 50 bindings "
                "(`region = eu` and `a` = 50..99, x-match all). Durable queues, persistent messages, published in "
                "transactions of 32 (`tx_commit` answers once they are routed and stored). A queue gets only what is "
                "routed while it is bound, so there is no catch-up case. Client: pika, one connection per thread, "
                "4 threads.",
    "redis": "Redis streams have no server-side filter: every drain reads the whole stream (`XREADGROUP`, "
             "acknowledged with `XACK`) and filters in the client, so its matched/s counts only the matches "
             "among everything read. "
             "`appendonly yes` with `appendfsync everysec`. Client: redis-py, pipelines of 32 `XADD`s from 4 "
             "threads.",
    "activemq": "ActiveMQ evaluates JMS selectors on the broker; over STOMP every header is a string, so "
                "`a >= 50` is written `a IN ('50', ..., '99')`. Durable topic subscriptions made before the writes "
                "hold the matches of each selector (persistent messages in KahaDB; the last of every 32 sends asks "
                "for a "
                "receipt, which KahaDB answers after its write); a topic subscription gets only what is published "
                "while it exists, so there is no catch-up case. Client: stomp.py, 4 threads.",
}


Row = tuple[str, str, Callable[[dict[str, Any]], Any]]


def _get(*path: str) -> Callable[[dict[str, Any]], Any]:
    def pick(system: dict[str, Any]) -> Any:
        node: Any = system
        for key in path:
            if not isinstance(node, dict) or key not in node:
                return None
            node = node[key]
        return node
    return pick


def _drain(name: str, case: str) -> Callable[[dict[str, Any]], Any]:
    pick = _get("drains", name, case)

    def value(system: dict[str, Any]) -> Any:
        d = pick(system)
        if not isinstance(d, dict):
            return None
        if "unsupported" in d or "error" in d:
            return d
        return d.get("matched_per_s")
    return value


def _inline(rate: str) -> Callable[[dict[str, Any]], Any]:
    """Sluice's run with ``consume_inline``; for a peer whose client calls its handler on its I/O thread anyway
    (``handler_on_io_thread``: nats-py's loop, pika's and stomp.py's connection threads, the Redis reader), its
    one latency run."""
    own, plain = _get("latency_inline", rate), _get("latency", rate)

    def value(system: dict[str, Any]) -> Any:
        return plain(system) if system.get("handler_on_io_thread") else own(system)
    return value


#: (key, label, how to read the cell from a system's result).
ROWS: tuple[Row, ...] = (
    ("produce", "produce msgs/s", _get("produce", "msgs_per_s")),
    ("produce_sync", "produce msgs/s, fsync before ack", _get("produce", "sync_msgs_per_s")),
    *((f"{name}_{case}", f"{label} drain, matched/s ({'subscribed before' if case == 'before' else 'catch-up'})",
       _drain(name, case))
      for name, label in (("tag", "tag"), ("region", "region"), ("sql92", "SQL92"))
      for case in ("before", "catchup")),
    ("latency_1000", "latency p50 / p99 ms at 1,000 msgs/s", _get("latency", "1000")),
    ("latency_10000", "latency p50 / p99 ms at 10,000 msgs/s", _get("latency", "10000")),
    ("latency_inline_1000", "latency p50 / p99 ms at 1,000 msgs/s, listener on the I/O thread",
     _inline("1000")),
    ("latency_inline_10000", "latency p50 / p99 ms at 10,000 msgs/s, listener on the I/O thread",
     _inline("10000")),
    *((f"latency_auto_batch_{rate}",
       f"latency p50 / p99 ms at {int(rate):,} msgs/s, listener on the I/O thread, producer auto-batching",
       _get("latency_auto_batch", rate)) for rate in ("1000", "10000")),
)


def cell_value(raw: Any) -> float | None:
    """The number a cell compares by (msgs/s, or the p50 of a latency); None when there is none."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, (int, float)) and math.isfinite(raw) and raw > 0:
        return float(raw)
    if isinstance(raw, dict) and isinstance(raw.get("p50_ms"), (int, float)) and "error" not in raw:
        p50 = float(raw["p50_ms"])
        return p50 if math.isfinite(p50) else None
    return None


def _fmt(raw: Any) -> str:
    if raw is None:
        return "—"
    if isinstance(raw, dict):
        if "unsupported" in raw:
            return "n/a"
        if "error" in raw:
            return "failed"
        if "p50_ms" in raw:
            return f"{raw['p50_ms']:.2f} / {raw['p99_ms']:.1f}"
        return "—"
    if isinstance(raw, (int, float)):
        return f"{raw:,.0f}"
    return str(raw)


def _change(key: str, now: float | None, before: float | None) -> str:
    if now is None or before is None or before == 0:
        return ""
    pct = (now - before) / before * 100
    better = pct < 0 if key.startswith("latency") else pct > 0
    return f" ({pct:+.0f}%{' better' if better and abs(pct) >= 1 else ''})"


def _short_of_rate(key: str, raw: Any) -> str:
    """A latency run whose sender fell more than 10 % short of the asked rate says the rate it reached (a
    blocking sender slows down; an asynchronous one queues, and its latency then includes that queue)."""
    if not key.startswith("latency_") or not isinstance(raw, dict) or "p50_ms" not in raw:
        return ""
    target, achieved = int(key.rsplit("_", 1)[1]), raw.get("achieved_rate")
    if isinstance(achieved, (int, float)) and achieved < 0.9 * target:
        return f", sent at {achieved:,.0f}/s"
    return ""


def table_rows(result: dict[str, Any], previous: dict[str, Any] | None = None) -> list[list[str]]:
    """The table as text cells: a header row, then one row per ROWS entry (with the change, if any)."""
    systems = [s for s in SYSTEMS if s in result.get("systems", {})]
    out = [["", *(TITLES[s] for s in systems)]]
    prev_systems = (previous or {}).get("systems", {})
    for key, label, pick in ROWS:
        row = [label]
        for s in systems:
            sysres = result["systems"][s]
            if not sysres.get("available"):
                row.append("not run")
                continue
            raw = pick(sysres)
            cell = _fmt(raw) + _short_of_rate(key, raw)
            prev = prev_systems.get(s)
            if prev and prev.get("available"):
                cell += _change(key, cell_value(raw), cell_value(pick(prev)))
            row.append(cell)
        out.append(row)
    return out


def _md_table(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    return "\n".join(lines)


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def _notes(result: dict[str, Any]) -> list[str]:
    lines = []
    for s in SYSTEMS:
        r = result.get("systems", {}).get(s)
        if r is None:
            continue
        if not r.get("available"):
            lines.append(f"- **{TITLES[s]}** skipped: {r.get('skipped', 'not run')}")
            continue
        problems = [f"{row}: {d['error']}" for row, d in _errors(r)]
        unsupported = sorted({d["unsupported"] for _, d in _errors(r, "unsupported")})
        for u in unsupported:
            lines.append(f"- **{TITLES[s]}** n/a: {u}")
        for p in problems:
            lines.append(f"- **{TITLES[s]}** failed: {p}")
    return lines


def _sluice_filter_counters(result: dict[str, Any]) -> list[str]:
    lines = []
    drains = (result.get("systems", {}).get("sluice") or {}).get("drains") or {}
    for name, cases in drains.items():
        for case, d in cases.items():
            bf = d.get("broker_filter") if isinstance(d, dict) else None
            if isinstance(bf, dict) and "evaluated" in bf:
                lines.append(f"- {name} ({case}): evaluated {bf['evaluated']:,}, bitmap skipped "
                             f"{bf.get('bitmapSkipped', 0):,}, bitmap hits {bf.get('bitmapHits', 0):,}")
    return lines


def _errors(r: dict[str, Any], key: str = "error") -> list[tuple[str, dict[str, Any]]]:
    found = []
    if key in r and isinstance(r[key], str):
        found.append(("run", r))
    for name, cases in (r.get("drains") or {}).items():
        for case, d in cases.items():
            if isinstance(d, dict) and key in d:
                found.append((f"{name} drain ({case})", d))
    for name, what in (("latency", ""), ("latency_inline", ", listener on the I/O thread"),
                       ("latency_auto_batch", ", listener on the I/O thread, producer auto-batching")):
        for rate, d in (r.get(name) or {}).items():
            if isinstance(d, dict) and key in d:
                found.append((f"latency at {rate} msgs/s{what}", d))
    return found


def _probe_lines(probe: dict[str, Any]) -> list[str]:
    """The host probe (machine.host_probe) at the run's start and end, as one sentence (none without it)."""
    runs = [(when, probe[when]) for when in ("start", "end") if probe.get(when)]
    if not runs:
        return []

    def both(key: str) -> str:
        return " / ".join(f"{p[key]:,.1f}" for _, p in runs)

    text = (f"Host probe at the {' / '.join(when for when, _ in runs)} of the run: a fixed piece of Python work "
            f"took {both('python_ms')} ms (best of five)")
    if all(p.get("loopback_rtt_us") is not None and p.get("loopback_rtt_after_idle_us") is not None
           for _, p in runs):
        text += (f"; a loopback round trip between threads on two cores {both('loopback_rtt_us')} µs back to back "
                 f"and {both('loopback_rtt_after_idle_us')} µs after 1 ms idle (p50)")
    return [text + ". On a shared machine these move with the neighbours' load; compare runs made at different "
            "times together with them."]


def render_markdown(result: dict[str, Any], previous: dict[str, Any] | None = None,
                    plots: list[str] | None = None) -> str:
    m = result.get("machine", {})
    load = result.get("load", {})
    disk = m.get("disk", {})
    disk_text = ", ".join(str(x) for x in (disk.get("device"), disk.get("fstype")) if x) or "unknown"
    if "rotational" in disk:
        disk_text += ", rotational" if disk["rotational"] else ", SSD"
    if disk.get("size_bytes") and "free_bytes" in disk:
        disk_text += f", {_gib(disk['free_bytes'])} of {_gib(disk['size_bytes'])} free"
    parts = [
        "# sluice bench", "",
        f"Measured {result.get('started', '?')}{' (--quick)' if result.get('quick') else ''}.",
        f"Machine: {m.get('cores', '?')} cores ({m.get('cpu', '?')}), {_gib(m.get('memory_bytes', 0))} memory, "
        f"{m.get('python', '?')}, disk {disk_text} under {disk.get('path', '?')}; "
        f"load average at the start {', '.join(str(x) for x in m.get('load_average', []))}.",
        *_probe_lines(result.get("host_probe") or {}),
        "",
        f"Load: {load.get('messages', 0):,} messages of {load.get('body_size', 0):,} bytes with a tag (TagA–TagJ), "
        "`region` (10 values) and `a` (0–99 as text); producers send batches of "
        f"{load.get('batch', '?')} from {load.get('threads', '?')} threads. Drains: "
        + "; ".join(f"{k}: `{v}`" for k, v in (load.get("filters") or {}).items())
        + f". Latency: single messages paced at {', '.join(f'{r:,}' for r in load.get('latency_rates', []))} "
        f"msgs/s for {load.get('latency_seconds', '?')} s each, measured on `region = 'eu'` from the send call to "
        "the consumer's callback (same process).",
        "",
        "Drain figures are matched messages per second from the consumer's start (subscribing, joining, its "
        "first request) to the last matched delivery; latency cells are p50 / p99 in ms (with the rate reached "
        "when the sender fell more than 10 % short). Sluice's push consumer calls its listener on consume "
        "threads, as RocketMQ's does; the rows 'listener on the I/O thread' run it with `consume_inline` on the "
        "client's event loop, which is how every peer's client here calls its handler (nats-py on its asyncio "
        "loop, pika and stomp.py on their connection threads, Redis in the reading thread), so the peers show "
        "the same run in both. Before each system is measured, the bench process moves what it holds (its "
        "imports, the generated workload) out of Python's cyclic garbage collector's reach (`gc.freeze`), so a "
        "full collection of the harness's own objects does not land inside a drain; every system runs so."
        + (" A figure in brackets is the change from the previous result in this directory"
           f" ({previous.get('started', '?')})." if previous else ""),
        "",
        _md_table(table_rows(result, previous)),
        "",
    ]
    notes = _notes(result)
    if notes:
        parts += ["Notes:", "", *notes, ""]
    counters = _sluice_filter_counters(result)
    if counters:
        parts += ["Sluice's broker filter counters per drain (records evaluated by the selector, skipped on the "
                  "bitmap, bitmap hits):", "", *counters, ""]
    parts += ["## How each system filters and persists", ""]
    for s in SYSTEMS:
        if s in result.get("systems", {}):
            parts += [f"**{TITLES[s]}.** {HOW[s]}", ""]
    if plots:
        parts += ["## Plots", "", *(f"![{p}]({p})" for p in plots), ""]
    scale = result.get("scale")
    if scale:
        parts += ["## Scale", "", "| messages | SQL92 groups | produce msgs/s | drain matched/s (all groups) | "
                  "broker RSS MiB |", "|---|---|---|---|---|"]
        for r in scale:
            parts.append(f"| {r.get('messages', 0):,} | {r.get('groups', 0)} | {_fmt(r.get('produce_msgs_per_s'))} "
                         f"| {_fmt(r.get('drain_matched_per_s'))} | {r.get('broker_rss_bytes', 0) / 2**20:,.0f} |"
                         + (f" {r['error']}" if r.get("error") else ""))
        parts.append("")
    bench = result.get("benchmarks")
    if bench:
        parts += ["## benchmarks/", ""]
        if "skipped" in bench:
            parts += [str(bench["skipped"]), ""]
        else:
            for name, r in bench.items():
                status = f"failed: {r['error']}" if "error" in r else "ok"
                parts.append(f"- `{name}.py` ({r.get('seconds', '?')} s): {status}")
            parts += ["", "Their last-line JSON objects are in the JSON result under `benchmarks`.", ""]
    return "\n".join(parts)
