"""The bench report from canned results: the table, the change column, the notes, the plots and the JSON."""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest

from sluice.bench.command import PREVIOUS, REPORT, RESULT, _parse_peers, write_outputs
from sluice.bench.report import HOW, ROWS, render_markdown, table_rows
from sluice.bench.workload import (
    FILTERS, Workload, body_with_stamp, chunks, expected_counts, generate, percentile, stamp_of,
)


def _drains(base: int) -> dict[str, Any]:
    return {name: {"before": {"matched": 100, "expected": 100, "matched_per_s": base + i},
                   "catchup": {"matched": 100, "expected": 100, "matched_per_s": base + 10 + i}}
            for i, name in enumerate(("tag", "region", "sql92"))}


def canned(scale: float = 1.0) -> dict[str, Any]:
    return {
        "version": 1, "started": "2026-11-27T18:00:00+00:00", "quick": True,
        "machine": {"cores": 2, "cpu": "test cpu", "memory_bytes": 8 * 2**30, "python": "CPython 3.11.7",
                    "load_average": [0.5, 0.4, 0.3], "disk": {"path": "/tmp/x", "device": "/dev/vda",
                                                               "fstype": "ext4", "size_bytes": 252 * 2**30,
                                                               "free_bytes": 2**29}},
        "load": {**Workload.quick().as_dict(), "flush": "both"},
        "host_probe": {"start": {"python_ms": 3.14, "loopback_rtt_us": 48.3, "loopback_rtt_after_idle_us": 100.9},
                       "end": {"python_ms": 6.95, "loopback_rtt_us": 75.6, "loopback_rtt_after_idle_us": 94.9}},
        "systems": {
            "sluice": {"available": True, "produce": {"msgs_per_s": int(30000 * scale),
                                                      "sync_msgs_per_s": int(20000 * scale)},
                       "drains": _drains(int(10000 * scale)),
                       "latency": {"1000": {"p50_ms": 2.0 / scale, "p99_ms": 5.0}, "10000": {"p50_ms": 3.0,
                                                                                           "p99_ms": 9.0}},
                       "latency_inline": {"1000": {"p50_ms": 1.5, "p99_ms": 4.0}}},
            "nats": {"available": True, "produce": {"msgs_per_s": 80000},
                     "drains": {**_drains(13000), "sql92": {"before": {"matched_per_s": 6800},
                                                            "catchup": {"error": "drained 5 of 9 within 1 s"}}},
                     "handler_on_io_thread": True, "latency": {"1000": {"p50_ms": 0.75, "p99_ms": 7.9}}},
            "rabbitmq": {"available": True, "produce": {"msgs_per_s": 13000},
                         "drains": {n: {"before": {"matched_per_s": 19000},
                                        "catchup": {"unsupported": "a queue gets only what is routed while bound"}}
                                    for n in ("tag", "region", "sql92")},
                         "latency": {"1000": {"p50_ms": 0.85, "p99_ms": 2.2}}},
            "redis": {"available": False, "skipped": "redis-server is not installed: run scripts/install-peers.sh"},
        },
        "benchmarks": {"sdk_bench": {"result": {"benchmark": "sdk"}, "seconds": 3.0},
                       "spark_read": {"error": "exit code 1 (log x)", "seconds": 1.0}},
    }


def test_the_table_has_a_row_per_figure_and_a_column_per_system() -> None:
    rows = table_rows(canned())
    assert rows[0] == ["", "Sluice", "NATS JetStream", "RabbitMQ", "Redis streams"]
    assert [r[0] for r in rows[1:]] == [label for _, label, _ in ROWS]
    by_label = {r[0]: r[1:] for r in rows[1:]}
    assert by_label["produce msgs/s"] == ["30,000", "80,000", "13,000", "not run"]
    assert by_label["produce msgs/s, fsync before ack"][:3] == ["20,000", "—", "—"]
    assert by_label["SQL92 drain, matched/s (catch-up)"][:3] == ["10,012", "failed", "n/a"]
    assert by_label["latency p50 / p99 ms at 1,000 msgs/s"][:3] == ["2.00 / 5.0", "0.75 / 7.9", "0.85 / 2.2"]
    # Sluice's consume_inline run; NATS's client calls its handler on its I/O thread: its one run; RabbitMQ's
    # result does not say so here, so it shows nothing rather than a run of another kind
    assert by_label["latency p50 / p99 ms at 1,000 msgs/s, listener on the I/O thread"][:3] == \
        ["1.50 / 4.0", "0.75 / 7.9", "—"]


def test_a_latency_run_short_of_its_rate_says_the_rate_reached() -> None:
    result = canned()
    result["systems"]["sluice"]["latency"]["10000"]["achieved_rate"] = 7121
    result["systems"]["nats"]["latency"]["10000"] = {"p50_ms": 0.3, "p99_ms": 5.0, "achieved_rate": 9560}
    row = {r[0]: r[1:] for r in table_rows(result)[1:]}["latency p50 / p99 ms at 10,000 msgs/s"]
    assert row[:2] == ["3.00 / 9.0, sent at 7,121/s", "0.30 / 5.0"]


def test_the_change_from_a_previous_result_is_shown_per_cell() -> None:
    rows = {r[0]: r[1:] for r in table_rows(canned(2.0), previous=canned(1.0))[1:]}
    assert rows["produce msgs/s"][0] == "60,000 (+100% better)"
    assert rows["latency p50 / p99 ms at 1,000 msgs/s"][0] == "1.00 / 5.0 (-50% better)"
    assert rows["latency p50 / p99 ms at 10,000 msgs/s"][0] == "3.00 / 9.0 (+0%)"
    assert rows["produce msgs/s"][1] == "80,000 (+0%)"  # peers compare too
    assert rows["SQL92 drain, matched/s (catch-up)"][1] == "failed"  # nothing to compare with
    worse = {r[0]: r[1:] for r in table_rows(canned(1.0), previous=canned(2.0))[1:]}
    assert worse["produce msgs/s"][0] == "30,000 (-50%)"


def test_the_markdown_states_machine_load_peers_and_failures() -> None:
    text = render_markdown(canned(), previous=None, plots=["throughput.png"])
    assert "2 cores (test cpu), 8.0 GiB memory, CPython 3.11.7, disk /dev/vda, ext4, 0.5 GiB of 252.0 GiB free" in text
    assert "20,000 messages of 1,024 bytes" in text
    assert ("Host probe at the start / end of the run: a fixed piece of Python work took 3.1 / 7.0 ms (best of "
            "five); a loopback round trip between threads on two cores 48.3 / 75.6 µs back to back and 100.9 / "
            "94.9 µs after 1 ms idle (p50).") in text
    assert "| produce msgs/s | 30,000 | 80,000 | 13,000 | not run |" in text
    assert "**Redis streams** skipped: redis-server is not installed: run scripts/install-peers.sh" in text
    assert "**NATS JetStream** failed: sql92 drain (catchup): drained 5 of 9 within 1 s" in text
    assert "**RabbitMQ** n/a: a queue gets only what is routed while bound" in text
    for system in ("sluice", "nats", "rabbitmq", "redis"):
        assert HOW[system] in text
    assert "![throughput.png](throughput.png)" in text
    assert "- `spark_read.py` (1.0 s): failed: exit code 1 (log x)" in text
    assert "change from the previous result" not in text


def test_the_host_probe_is_left_out_when_missing_and_its_round_trips_on_one_core() -> None:
    r = canned()
    del r["host_probe"]
    assert "Host probe" not in render_markdown(r)
    r["host_probe"] = {"start": {"python_ms": 3.0, "loopback_rtt_us": None, "loopback_rtt_after_idle_us": None}}
    text = render_markdown(r)
    assert "Host probe at the start of the run: a fixed piece of Python work took 3.0 ms (best of five). On" in text


def test_host_probe_measures_the_interpreter_and_loopback_round_trips() -> None:
    from sluice.bench.machine import host_probe
    before = os.sched_getaffinity(0)
    p = host_probe()
    assert os.sched_getaffinity(0) == before  # the probe pins its threads, then gives this one its cores back
    assert p["python_ms"] > 0
    if len(os.sched_getaffinity(0)) >= 2:
        assert 0 < p["loopback_rtt_us"] < 1e6 and 0 < p["loopback_rtt_after_idle_us"] < 1e6
    else:
        assert p["loopback_rtt_us"] is None and p["loopback_rtt_after_idle_us"] is None


def test_outputs_are_written_and_the_previous_result_kept(tmp_path: Path) -> None:
    plots = write_outputs(canned(1.0), tmp_path, previous=None)
    assert plots == ["throughput.png", "latency.png"]
    for name in plots:
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert json.loads((tmp_path / RESULT).read_text())["systems"]["sluice"]["produce"]["msgs_per_s"] == 30000
    newer = canned(2.0)
    write_outputs(newer, tmp_path, previous=json.loads((tmp_path / RESULT).read_text()))
    assert json.loads((tmp_path / PREVIOUS).read_text())["systems"]["sluice"]["produce"]["msgs_per_s"] == 30000
    assert "60,000 (+100% better)" in (tmp_path / REPORT).read_text()


def test_a_scale_table_gets_its_rows_and_plot(tmp_path: Path) -> None:
    result = copy.deepcopy(canned())
    result["scale"] = [{"messages": 1000, "groups": g, "produce_msgs_per_s": 100 * g, "drain_matched_per_s": 50 * g,
                        "broker_rss_bytes": 2**20 * 60 * g} for g in (1, 10)]
    result["scale"].append({"messages": 2000, "groups": 1, "error": "RuntimeError: boom"})
    plots = write_outputs(result, tmp_path, previous=None)
    assert "scale.png" in plots and (tmp_path / "scale.png").stat().st_size > 5000
    text = (tmp_path / REPORT).read_text()
    assert "| 1,000 | 10 | 1,000 | 500 | 600 |" in text
    assert "| 2,000 | 1 | — | — | 0 | RuntimeError: boom" in text


def test_unknown_peers_are_refused_by_name() -> None:
    import click
    assert _parse_peers("nats, redis") == ["nats", "redis"]
    assert _parse_peers("") == []
    with pytest.raises(click.BadParameter, match="unknown peer\\(s\\) kafka"):
        _parse_peers("nats,kafka")


def test_the_workload_is_deterministic_and_its_expectations_match_the_filters() -> None:
    props = generate(5000, 15)
    assert props == generate(5000, 15)
    counts = expected_counts(props)
    assert set(counts) == {f.name for f in FILTERS}
    assert 0 < counts["sql92"] < counts["region"] and 0 < counts["tag"] < 5000
    assert counts["sql92"] == sum(1 for p in props if p.region == "eu" and p.a >= 50)
    parts = chunks(props, 4)
    assert len(parts) == 4 and sum(parts, []) == props
    body = body_with_stamp(1024, 123456789)
    assert len(body) == 1024 and stamp_of(body) == 123456789
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0 and percentile([1.0, 2.0, 3.0, 4.0], 99) == 4.0
