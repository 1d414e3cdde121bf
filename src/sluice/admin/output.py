"""What a command returns (:class:`Result`) and how it is shown: rich tables for people, JSON for scripts.

A command builds its answer once as plain data; ``--json`` prints ``Result.data``
(one JSON document on stdout), otherwise the tables and notes are rendered.
Warnings go to stderr in both modes so stdout stays parseable.
"""
from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import orjson
from rich import box
from rich.console import Console
from rich.table import Table

from sluice.admin.status import ExitStatus
from sluice.message import MessageExt

__all__ = ["Result", "fmt_time", "kv_table", "make_console", "message_json", "message_role", "render", "table",
           "write_json"]


@dataclass
class Result:
    data: Any
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    status: ExitStatus = ExitStatus.SUCCESS


def table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]], *,
          right: Iterable[str] = ()) -> Table:
    """A table of strings; columns named in ``right`` (numbers) are right-aligned."""
    right = set(right)
    t = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", show_edge=False, pad_edge=False)
    for c in columns:
        t.add_column(c, justify="right" if c in right else "left", overflow="fold")
    for r in rows:
        t.add_row(*("" if v is None else str(v) for v in r))
    return t


def kv_table(title: str | None, pairs: Iterable[tuple[str, Any]]) -> Table:
    t = Table(title=title, box=box.SIMPLE, show_header=False, title_justify="left", show_edge=False,
              pad_edge=False)
    t.add_column("name", style="bold", no_wrap=True)
    t.add_column("value", overflow="fold")
    for k, v in pairs:
        t.add_row(k, "" if v is None else str(v))
    return t


def make_console(stream: TextIO, env: dict[str, str] | Any) -> Console:
    """No colours unless ``stream`` is a terminal; wide when it is not (a file, a pipe, a test buffer)."""
    isatty = getattr(stream, "isatty", lambda: False)()
    cols = str(env.get("COLUMNS", "")).strip()
    width = int(cols) if cols.isdigit() and int(cols) > 0 else (None if isatty else 200)
    return Console(file=stream, width=width, highlight=False, soft_wrap=False, emoji=False,
                   color_system="auto" if isatty and not env.get("NO_COLOR") else None)


def write_json(stream: TextIO, data: Any) -> None:
    stream.write(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode() + "\n")


def render(result: Result, stdout: TextIO, stderr: TextIO, env: Any, *, as_json: bool) -> None:
    for w in result.warnings:
        stderr.write(f"warning: {w}\n")
    if as_json:
        write_json(stdout, result.data)
        return
    console = make_console(stdout, env)
    for i, t in enumerate(result.tables):
        if i:
            console.print()
        console.print(t)
    for n in result.notes:
        console.print(n, markup=False)


def fmt_time(ms: int | None) -> str:
    """Local time with milliseconds, as mqadmin prints store times; empty for 0/unknown."""
    if not ms or ms <= 0:
        return ""
    return dt.datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def message_role(topic: str) -> str:
    """Which copy a stored message is: a retry copy, a dead letter, or the original."""
    if topic.startswith("%RETRY%"):
        return "retry"
    if topic.startswith("%DLQ%"):
        return "dead-letter"
    return "original"


def body_fields(body: bytes) -> dict[str, Any]:
    try:
        return {"bodyEncoding": "utf-8", "body": body.decode("utf-8")}
    except UnicodeDecodeError:
        return {"bodyEncoding": "base64", "body": base64.b64encode(body).decode("ascii")}


def body_preview(body: bytes, limit: int = 200) -> str:
    text = body[: limit * 4].decode("utf-8", errors="replace")
    return text if len(text) <= limit and len(body) <= limit * 4 else text[:limit] + f"… ({len(body)} bytes)"


def message_json(m: MessageExt, *, role: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "msgId": m.msg_id, "offsetMsgId": m.offset_msg_id, "topic": m.topic, "tags": m.tags, "keys": m.keys,
        "queueId": m.queue_id, "queueOffset": m.queue_offset, "commitLogOffset": m.commitlog_offset,
        "reconsumeTimes": m.reconsume_times, "bornTimestamp": m.born_timestamp,
        "bornHost": f"{m.born_host[0]}:{m.born_host[1]}", "storeTimestamp": m.store_timestamp,
        "storeHost": f"{m.store_host[0]}:{m.store_host[1]}", "sysFlag": m.sysflag, "flag": m.flag,
        "bodyCRC": m.body_crc, "storeSize": m.store_size, "properties": dict(m.properties),
    }
    if role is not None:
        out["role"] = role
    out.update(body_fields(m.body))
    return out


def message_detail(m: MessageExt, *, role: str | None = None) -> Table:
    """One message as mqadmin's queryMsgById prints it: one field a line."""
    pairs: list[tuple[str, Any]] = [
        ("Msg ID (UNIQ_KEY)", m.msg_id), ("Offset Msg ID", m.offset_msg_id), ("Topic", m.topic),
        ("Tags", m.tags or ""), ("Keys", " ".join(m.keys)), ("Queue ID", m.queue_id),
        ("Queue Offset", m.queue_offset), ("CommitLog Offset", m.commitlog_offset),
        ("Reconsume Times", m.reconsume_times), ("Born Timestamp", fmt_time(m.born_timestamp)),
        ("Store Timestamp", fmt_time(m.store_timestamp)),
        ("Born Host", f"{m.born_host[0]}:{m.born_host[1]}"), ("Store Host", f"{m.store_host[0]}:{m.store_host[1]}"),
        ("System Flag", m.sysflag), ("Properties", ", ".join(f"{k}={v}" for k, v in sorted(m.properties.items()))),
        ("Body", body_preview(m.body, 2000)),
    ]
    if role is not None:
        pairs.insert(0, ("Role", role))
    return kv_table(None, pairs)
