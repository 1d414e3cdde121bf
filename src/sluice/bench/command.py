"""`sluice bench`: the common workload against Sluice and the installed peers, the benchmarks/ scripts, and the
report (JSON, Markdown, PNG plots) in --out, compared with the previous result found there."""
from __future__ import annotations

import datetime as dt
import gc
import importlib
import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from sluice.bench.machine import describe_machine, host_probe
from sluice.bench.procs import PeerMissing
from sluice.bench.report import render_markdown
from sluice.bench.workload import Workload

__all__ = ["PEER_MODULES", "bench_command", "run_bench"]

#: --peers name -> the module whose ``run(workload, workdir, step)`` drives it.
PEER_MODULES = {"nats": "sluice.bench.peer_nats", "rabbitmq": "sluice.bench.peer_rabbitmq",
                "redis": "sluice.bench.peer_redis", "activemq": "sluice.bench.peer_activemq"}
RESULT = "bench.json"
PREVIOUS = "bench.previous.json"
REPORT = "bench.md"


def _parse_peers(value: str) -> list[str]:
    names = [p.strip() for p in value.split(",") if p.strip()] if value else []
    unknown = [p for p in names if p not in PEER_MODULES]
    if unknown:
        raise click.BadParameter(f"unknown peer(s) {', '.join(unknown)}; choose from {', '.join(PEER_MODULES)}",
                                 param_hint="--peers")
    return names


def _parse_ints(value: str, hint: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x.replace("_", "")) for x in value.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}", param_hint=hint) from None
    if not out or any(x < 1 for x in out):
        raise click.BadParameter("every value must be at least 1", param_hint=hint)
    return out


def _measured(run: Callable[..., dict[str, Any]], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """``run(*args, **kwargs)``, one system's (or the scale table's) runner, then its frozen heap given back
    to the garbage collector (the runner froze it to measure: workload.settle_heap), however it ended."""
    try:
        return run(*args, **kwargs)
    finally:
        gc.unfreeze()


def _run_peer(name: str, wl: Workload, workdir: Path, step: Any) -> dict[str, Any]:
    module = importlib.import_module(PEER_MODULES[name])
    try:
        result = _measured(module.run, wl, workdir / name, step)
        result["available"] = True
        return result
    except PeerMissing as exc:
        return {"available": False, "skipped": str(exc)}
    except Exception as exc:  # one peer's failure is reported, the others still run
        return {"available": False, "skipped": f"failed: {type(exc).__name__}: {exc}"}


def run_bench(wl: Workload, out: Path, *, quick: bool, peers: list[str], flush: str, scripts: bool,
              scale: dict[str, tuple[int, ...]] | None, echo: Any = click.echo) -> dict[str, Any]:
    """The whole run; writes bench.json, bench.md and the PNGs into ``out`` and returns the result."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from sluice.bench.sluice_runner import run_sluice

    out.mkdir(parents=True, exist_ok=True)
    previous: dict[str, Any] | None = None
    if (out / RESULT).exists():
        try:
            previous = json.loads((out / RESULT).read_text())
        except ValueError as exc:
            echo(f"ignoring the unreadable previous result {out / RESULT}: {exc}")
    workdir = Path(tempfile.mkdtemp(prefix="sluice-bench-"))
    result: dict[str, Any] = {
        "version": 1, "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "quick": quick, "machine": describe_machine(workdir), "load": {**wl.as_dict(), "flush": flush},
        "host_probe": {"start": host_probe()}, "systems": {},
    }
    total = 1 + len(peers) + (1 if scripts else 0) + (1 if scale else 0)
    try:
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                      TextColumn("[{task.completed}/{task.total}]"), transient=False) as progress:
            task = progress.add_task("sluice bench", total=total)

            def step(text: str) -> None:
                progress.update(task, description=text)

            result["systems"]["sluice"] = _measured(run_sluice, wl, workdir / "sluice", step,
                                                    sync_flush=flush == "both")
            progress.advance(task)
            for name in peers:
                step(f"{name}: starting")
                result["systems"][name] = r = _run_peer(name, wl, workdir, step)
                if not r["available"]:
                    progress.console.print(f"{name}: skipped: {r['skipped']}")
                progress.advance(task)
            if scripts:
                from sluice.bench.scripts import run_scripts
                result["benchmarks"] = run_scripts(quick, out / "logs", step)
                progress.advance(task)
            if scale:
                from sluice.bench.scale import run_scale
                result["scale"] = _measured(run_scale, wl, workdir / "scale", scale["messages"], scale["groups"],
                                            step)
                progress.advance(task)
        result["host_probe"]["end"] = host_probe()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result["finished"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    write_outputs(result, out, previous)
    return result


def write_outputs(result: dict[str, Any], out: Path, previous: dict[str, Any] | None) -> list[str]:
    """bench.json (the previous one kept as bench.previous.json), the PNG plots and bench.md; returns the plots."""
    from sluice.bench.plots import write_plots
    from sluice.persist import write_atomic

    if previous is not None:
        write_atomic(out / PREVIOUS, json.dumps(previous, indent=1).encode())
    write_atomic(out / RESULT, json.dumps(result, indent=1).encode())
    plots = write_plots(result, out)
    write_atomic(out / REPORT, render_markdown(result, previous, plots).encode())
    return plots


@click.command("bench")
@click.option("--quick", is_flag=True, help="A few minutes: 20,000 messages, 2 s per latency rate, "
                                            "benchmarks/ scripts with --quick.")
@click.option("--peers", default=",".join(PEER_MODULES), show_default=True,
              help="Comma-separated peers to run beside Sluice (empty for none).")
@click.option("--out", "out", type=click.Path(file_okay=False, path_type=Path), default=Path("bench-results"),
              show_default=True, help="Where bench.json, bench.md and the PNGs go; a bench.json already there is "
                                      "the previous result the report compares with.")
@click.option("--flush", type=click.Choice(["both", "async"]), default="both", show_default=True,
              help="Also measure produce on a broker with --flush sync (both) or not (async).")
@click.option("--scripts/--no-scripts", default=True, show_default=True, help="Run the benchmarks/ scripts.")
@click.option("--scale", is_flag=True, help="Also run the scale table (1M and 10M messages; 1, 10 and 100 SQL92 "
                                            "groups): long.")
@click.option("--messages", type=int, default=None, hidden=True, help="Override the message count (tests).")
@click.option("--latency-seconds", type=float, default=None, hidden=True, help="Seconds per latency rate (tests).")
@click.option("--scale-messages", default=None, hidden=True, help="Comma-separated message counts of --scale.")
@click.option("--scale-groups", default=None, hidden=True, help="Comma-separated group counts of --scale.")
def bench_command(quick: bool, peers: str, out: Path, flush: str, scripts: bool, scale: bool,
                  messages: int | None, latency_seconds: float | None, scale_messages: str | None,
                  scale_groups: str | None) -> None:
    """Measure the common workload (produce, filtered drains, latency) on Sluice and its peers, side by side."""
    from sluice.bench.scale import DEFAULT_GROUPS, DEFAULT_MESSAGES

    peer_names = _parse_peers(peers)
    if messages is not None and messages < 100:
        raise click.BadParameter("must be at least 100", param_hint="--messages")
    if latency_seconds is not None and latency_seconds <= 0:
        raise click.BadParameter("must be positive", param_hint="--latency-seconds")
    wl = Workload.quick(messages) if quick else Workload(messages=messages or Workload.messages)
    if latency_seconds is not None:
        wl = Workload(**{**wl.__dict__, "latency_seconds": latency_seconds})
    scale_plan = None
    if scale or scale_messages or scale_groups:
        scale_plan = {"messages": _parse_ints(scale_messages, "--scale-messages") if scale_messages
                      else DEFAULT_MESSAGES,
                      "groups": _parse_ints(scale_groups, "--scale-groups") if scale_groups else DEFAULT_GROUPS}
    try:
        result = run_bench(wl, out, quick=quick, peers=peer_names, flush=flush, scripts=scripts, scale=scale_plan)
    except (RuntimeError, TimeoutError, OSError) as exc:  # Sluice itself could not be measured
        raise click.ClickException(f"sluice bench failed: {exc}") from None
    click.echo(f"Wrote {out / RESULT}, {out / REPORT} and the plots in {out}")
    drains = result["systems"]["sluice"].get("drains") or {}
    failed = [f"{name} ({case}): {c['error']}" for name, cases in drains.items() for case, c in cases.items()
              if isinstance(c, dict) and "error" in c]
    if failed:  # Sluice itself lost or misfiltered messages: the run is not a measurement
        raise click.ClickException("Sluice drains failed: " + "; ".join(failed))
