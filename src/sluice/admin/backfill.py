"""``sluice admin loadBackfill``: hand the result of ``sluice spark backfill`` to the broker whose store it
was computed over (PUT_FILTER_BACKFILL, Sluice's request code 20021, one request per queue).

The broker validates each queue's bitmap (selector hash, sizes, offsets against its consume queue, the
group's live subscription, and sampled stored records against the bits marked 0) and refuses what does
not fit; see broker/backfill.py and docs/spark.md. An ADMIN request when the broker runs with ACL.
"""
from __future__ import annotations

from pathlib import Path

import click
import orjson

from sluice.admin.core import admin_command
from sluice.admin.output import Result, table
from sluice.admin.session import AdminSession
from sluice.admin.status import ExitStatus
from sluice.errors import InvalidParameterError, SluiceError
from sluice.protocol.codes import RequestCode


def read_manifest(directory: str) -> dict:
    path = Path(directory) / "manifest.json"
    try:
        m = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise InvalidParameterError(f"cannot read the backfill manifest {path}: {exc}") from None
    for k in ("topic", "group", "expression_type", "expression", "queues"):
        if k not in m:
            raise InvalidParameterError(f"{path} has no {k!r}: not written by `sluice spark backfill`")
    return m


def queue_file(directory: str, manifest: dict, queue_id: str) -> Path:
    """The layout's path under ``directory`` (the manifest's absolute path is where the job wrote it)."""
    p = Path(directory) / manifest["topic"] / queue_id / f"{manifest['group']}.bitmap"
    return p if p.exists() else Path(manifest["queues"][queue_id].get("file", p))


@admin_command("loadBackfill", aliases=["backfill-load"])
@click.option("-d", "--dir", "directory", required=True, type=click.Path(file_okay=False),
              help="The --out directory of `sluice spark backfill` (manifest.json and the bitmaps).")
@click.option("-b", "--brokerAddr", "broker_addr", required=True, metavar="HOST:PORT",
              help="The broker whose store the backfill read.")
async def load_backfill(s: AdminSession, directory: str, broker_addr: str) -> Result:
    """Give a broker the bitmaps of a backfill so pulls over the backlog skip non-matching messages unread."""
    m = read_manifest(directory)
    rows, data, warnings = [], {}, []
    for qid in sorted(m["queues"], key=int):
        path = queue_file(directory, m, qid)
        try:
            body = path.read_bytes()
        except OSError as exc:
            raise InvalidParameterError(f"cannot read {path}: {exc}") from None
        fields = {"consumerGroup": m["group"], "topic": m["topic"], "queueId": qid,
                  "expressionType": m["expression_type"], "expression": m["expression"]}
        try:
            resp = await s.invoke(broker_addr, RequestCode.PUT_FILTER_BACKFILL, fields, body)
        except SluiceError as exc:
            warnings.append(f"queue {qid}: refused: {exc}")
            rows.append([qid, "refused", "", "", ""])
            data[qid] = {"error": str(exc)}
            continue
        info = orjson.loads(resp.body)
        data[qid] = info
        rows.append([qid, "loaded", info["first"], info["end"], info["matched"]])
    loaded = sum(1 for v in data.values() if "error" not in v)
    status = ExitStatus.SUCCESS if loaded == len(data) else (ExitStatus.PARTIAL if loaded else ExitStatus.REFUSED)
    t = table(f"{m['group']} on {m['topic']}: {m['expression_type']} {m['expression']}",
              ["Queue", "Outcome", "First", "End", "Matched"], rows, right=["First", "End", "Matched"])
    return Result({"topic": m["topic"], "group": m["group"], "queues": data}, [t], [], warnings, status)
