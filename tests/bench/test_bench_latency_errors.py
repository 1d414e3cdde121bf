"""A latency run whose sends fail (a sender fallen behind its rate times out) records the failure in its row
instead of ending the whole `sluice bench` run, and says how many failed."""
from __future__ import annotations

import concurrent.futures
from pathlib import Path
from typing import Any

import pytest
from servers import running_cluster

from sluice.bench import sluice_runner
from sluice.bench.workload import Workload
from sluice.errors import RemotingTimeoutError

pytestmark = [pytest.mark.slow, pytest.mark.integration]


class _EveryTenthTimesOut(sluice_runner.Producer):  # type: ignore[misc,valid-type]
    """The real producer; every tenth send_async answers as one stuck behind the sender's queue would."""

    calls = 0

    def send_async(self, msg: Any, **kw: Any) -> concurrent.futures.Future[Any]:
        type(self).calls += 1
        if type(self).calls % 10 == 0:
            fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
            fut.set_exception(RemotingTimeoutError("no response to request code 310 within 3 s"))
            return fut
        return super().send_async(msg, **kw)


def test_failed_sends_are_the_rows_error_not_the_runs_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with running_cluster(tmp_path, ("broker-a",)) as c:
        sluice_runner.create_topic(c.ns)
        monkeypatch.setattr(sluice_runner, "Producer", _EveryTenthTimesOut)
        wl = Workload(messages=100, latency_rates=(200,), latency_seconds=0.5)
        (row,) = sluice_runner.latency(c.ns, wl)
    assert row["rate"] == 200 and row["sent"] == 100
    assert row["error"].startswith("10 of 100 sends failed") and "RemotingTimeoutError" in row["error"]
    assert 0 < row["received"] <= row["expected"]  # the sends that went through were measured


def test_sends_are_counted_as_they_complete_and_the_unanswered_fail() -> None:
    """The run keeps no Future: _Sends counts completions and failures as they happen (one done before it was
    tracked, one done later, one failed), and a send still unanswered at the deadline is a failure."""
    sends = sluice_runner._Sends()
    done: concurrent.futures.Future[Any] = concurrent.futures.Future()
    done.set_result("ok")
    later: concurrent.futures.Future[Any] = concurrent.futures.Future()
    bad: concurrent.futures.Future[Any] = concurrent.futures.Future()
    for f in (done, later, bad):
        sends.track(f)
    later.set_result("ok")
    bad.set_exception(RemotingTimeoutError("no response"))
    assert sends.wait(5) == sends.failed and [type(e) for e in sends.failed] == [RemotingTimeoutError]
    assert (sends.sent, sends.done) == (3, 3)
    sends.track(concurrent.futures.Future())  # never answered
    failed = sends.wait(0.01)
    assert [type(e) for e in failed] == [RemotingTimeoutError, TimeoutError] and sends.sent == 4
