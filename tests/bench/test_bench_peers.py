"""Each peer of `sluice bench` runs the common workload with a tiny load when its server and Python client are
installed (scripts/install-peers.sh); otherwise the test is skipped with the install line as its reason."""
from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from sluice.bench.command import PEER_MODULES, _measured
from sluice.bench.procs import PeerMissing
from sluice.bench.workload import Workload

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.mark.parametrize("peer", sorted(PEER_MODULES))
def test_a_peer_runs_the_workload_when_installed(peer: str, tmp_path: Path) -> None:
    module = importlib.import_module(PEER_MODULES[peer])
    try:
        module.check()
    except PeerMissing as exc:
        pytest.skip(str(exc))
    wl = Workload(messages=300, latency_rates=(200,), latency_seconds=0.5, drain_timeout=60)
    result = _measured(module.run, wl, tmp_path, lambda s: None)  # the heap it froze to measure given back
    assert result["produce"]["msgs_per_s"] > 0
    for name, cases in result["drains"].items():
        for case, d in cases.items():
            if "unsupported" in d:
                continue
            assert "error" not in d, (name, case, d)
            assert d["matched"] == d["expected"] > 0, (name, case, d)
    lat = result["latency"]["200"]
    assert lat["received"] == lat["expected"] > 0


def test_a_missing_peer_is_skipped_with_the_install_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice.bench.command import _run_peer
    from sluice.bench.procs import require
    with pytest.raises(PeerMissing, match="no-such-peer-server is not installed: run scripts/install-peers.sh"):
        require("no-such-peer-server", "json", "json")
    with pytest.raises(PeerMissing, match="the Python client nope is not installed: run scripts/install-peers.sh"):
        require("sh", "no_such_module_for_bench", "nope")
    monkeypatch.setenv("PATH", str(tmp_path))  # no peer binary on the PATH
    for peer in ("nats", "redis"):
        result = _run_peer(peer, Workload(messages=100), tmp_path, lambda s: None)
        assert result == {"available": False,
                          "skipped": f"{peer}-server is not installed: run scripts/install-peers.sh"}
