"""`sluice bench --quick` end to end against Sluice (real namesrv and broker subprocesses) with a tiny load, and
the usage errors."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


pytestmark = [pytest.mark.slow, pytest.mark.integration]


def _bench(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sluice", "bench", "--quick", "--no-scripts", "--messages", "400",
                           "--latency-seconds", "0.3", "--out", str(out), *args],
                          capture_output=True, text=True, timeout=280)


def test_bench_quick_against_sluice_writes_positive_figures(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = _bench(out, "--peers", "")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((out / "bench.json").read_text())
    sluice = result["systems"]["sluice"]
    assert sluice["produce"]["msgs_per_s"] > 0 and sluice["produce"]["sync_msgs_per_s"] > 0
    for name in ("tag", "region", "sql92"):
        for case in ("before", "catchup"):
            d = sluice["drains"][name][case]
            assert "error" not in d, d
            assert d["matched"] == d["expected"] > 0 and d["matched_per_s"] > 0
    # The broker's own counters: a group subscribed before the writes skips records on its bitmap; a group that
    # subscribes afterwards evaluates every record (the 400 and the topic-creating one).
    for name in ("region", "sql92"):
        before = sluice["drains"][name]["before"]["broker_filter"]
        after = sluice["drains"][name]["catchup"]["broker_filter"]
        assert before["bitmapSkipped"] > 0 and before["evaluated"] < 401, before
        assert after["bitmapSkipped"] == 0 and after["evaluated"] >= 401, after
    for rate in ("1000", "10000"):
        lat = sluice["latency"][rate]
        assert lat["received"] == lat["expected"] > 0 and 0 < lat["p50_ms"] <= lat["p99_ms"]
    assert result["machine"]["cores"] >= 1 and result["load"]["messages"] == 400
    disk = result["machine"]["disk"]  # the disk the stores went to, and its room then
    assert disk["path"] != str(out) and 0 < disk["free_bytes"] <= disk["size_bytes"], disk
    for when in ("start", "end"):  # the host's speed then (machine.host_probe)
        probe = result["host_probe"][when]
        assert probe["python_ms"] > 0 and probe["loopback_rtt_us"] > 0 and probe["loopback_rtt_after_idle_us"] > 0
    text = (out / "bench.md").read_text()
    assert "Host probe at the start / end of the run: a fixed piece of Python work took " in text
    assert "| produce msgs/s |" in text and "## How each system filters and persists" in text
    assert "- sql92 (catchup): evaluated " in text
    for png in ("throughput.png", "latency.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"

    # A second run into the same directory compares with the first.
    proc = _bench(out, "--peers", "", "--flush", "async")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (out / "bench.previous.json").exists()
    assert "change from the previous result" in (out / "bench.md").read_text()


def test_bench_refuses_an_unknown_peer(tmp_path: Path) -> None:
    proc = _bench(tmp_path, "--peers", "kafka")
    assert proc.returncode == 2 and "unknown peer(s) kafka" in proc.stderr


def test_bench_scale_smoke_records_throughput_and_memory(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = _bench(out, "--peers", "", "--flush", "async", "--scale-messages", "300", "--scale-groups", "1,2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads((out / "bench.json").read_text())["scale"]
    assert [(r["messages"], r["groups"]) for r in rows] == [(300, 1), (300, 2)]
    for r in rows:
        assert "error" not in r, r
        assert r["produce_msgs_per_s"] > 0 and r["drain_matched_per_s"] > 0 and r["broker_rss_bytes"] > 0
    assert (out / "scale.png").read_bytes()[:4] == b"\x89PNG"
    assert "## Scale" in (out / "bench.md").read_text()


def test_bench_refuses_bad_scale_values(tmp_path: Path) -> None:
    proc = _bench(tmp_path, "--peers", "", "--scale-groups", "1,x")
    assert proc.returncode == 2 and "expected comma-separated integers" in proc.stderr
