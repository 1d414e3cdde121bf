"""``sluice store``: offline tools for a store directory (the broker must not have it open)."""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import click
import orjson

from sluice.errors import SluiceError
from sluice.store.config import MiB, StoreConfig
from sluice.store.message_store import MessageStore, read_layout

EXIT_OK, EXIT_PROBLEMS, EXIT_ERROR = 0, 1, 2


@click.group("store")
def store_group() -> None:
    """Inspect and repair a store directory."""


@store_group.command("check")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--fix", is_flag=True,
              help="Recover an uncleanly stopped store (cut a torn tail, saved under commitlog-tails/) and "
                   "rebuild consume queues that disagree with the commit log.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
def check_command(directory: Path, fix: bool, as_json: bool) -> None:
    """Verify every record (CRC), every consume-queue unit and the key index of DIRECTORY.

    Exit status: 0 no problems, 1 problems found, 2 the store could not be checked.
    """
    try:
        code, out = run_check(directory, fix=fix)
    except SluiceError as e:
        code, out = EXIT_ERROR, {"ok": False, "error": str(e)}
    if as_json:
        click.echo(orjson.dumps(out).decode())
    else:
        _print_text(out)
    sys.exit(code)


def run_check(directory: Path, *, fix: bool) -> tuple[int, dict[str, object]]:
    layout = read_layout(directory)
    if not layout:
        return EXIT_ERROR, {"ok": False, "error": f"{directory} holds no store (no store.json)"}
    if (directory / "abort").exists() and not fix:
        return EXIT_ERROR, {"ok": False, "error": "the store was not closed cleanly (or is open): opening it runs "
                                                  "recovery, which may cut a torn tail; run again with --fix"}
    # Index off unless present: checking must not create files; async flush: nothing is written anyway.
    config = StoreConfig(**layout, index_enable=(directory / "index").is_dir(),
                         max_message_size=min(4 * MiB, layout["commitlog_file_size"] - (1 << 16)))
    store = MessageStore(directory, config)
    store.start()
    try:
        rep = store.check(fix=fix)
        recovered = store.recovery_report
    finally:
        store.close()
    out: dict[str, object] = {
        "ok": rep.ok,
        "records": rep.records,
        "units": rep.units,
        "problems": [dataclasses.asdict(p) for p in rep.problems],
        "fixed": rep.fixed,
    }
    if recovered is not None and (recovered.abnormal or recovered.cut_bytes):
        out["recovery"] = dataclasses.asdict(recovered)
    return (EXIT_OK if rep.ok or (fix and rep.fixed and not _commitlog_problems(rep)) else EXIT_PROBLEMS), out


def _commitlog_problems(rep) -> bool:
    return any("consumequeue" not in p.path and p.path != "index" for p in rep.problems)


def _print_text(out: dict[str, object]) -> None:
    if "error" in out:
        click.echo(f"error: {out['error']}", err=True)
        return
    rec = out.get("recovery")
    if rec:
        click.echo(f"recovered: end offset {rec['end_offset']}, cut {rec['cut_bytes']} bytes"
                   + (f" (saved to {rec['tail_file']})" if rec["tail_file"] else ""))
    for p in out["problems"]:  # type: ignore[union-attr]
        click.echo(f"PROBLEM {p['path']} @ {p['offset']}: {p['message']}")
    for f in out["fixed"]:  # type: ignore[union-attr]
        click.echo(f"fixed: {f}")
    click.echo(f"{out['records']} records, {out['units']} consume-queue units: "
               + ("ok" if out["ok"] else f"{len(out['problems'])} problem(s)"))  # type: ignore[arg-type]
