"""Refused sends are logged once per client and reason a minute (broker/refusal_log.py): every refusal still
gets its precise error; the log does not grow with a client repeating a bad send."""
from __future__ import annotations

import logging

import pytest

from broker_support import BrokerHandle, Rpc
from sluice.broker.refusal_log import RefusalLog
from sluice.errors import MessageIllegalError, NoPermissionError
from sluice.protocol.codes import ResponseCode

_LOGGER = "sluice.broker.send"


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == _LOGGER and "refused" in r.getMessage()]


def test_repeated_bad_sends_log_once_per_reason(broker: BrokerHandle, rpc: Rpc,
                                                caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=_LOGGER)
    for i in range(20):  # different out-of-range values of one field: one reason
        r = rpc.send("Bad", b"x", flag=(1 << 32) + i)
        assert r.code == ResponseCode.MESSAGE_ILLEGAL and "flag" in r.remark and str((1 << 32) + i) in r.remark
    for _ in range(20):
        r = rpc.send("SCHEDULE_TOPIC_XXXX", b"x")
        assert r.code == ResponseCode.NO_PERMISSION
    for _ in range(5):
        assert rpc.send("Tx", b"rolled-back", sys_flag=0xC).code == ResponseCode.NO_PERMISSION  # never storable
    lines = _lines(caplog)
    assert len(lines) == 3, lines
    assert any("flag" in x for x in lines) and any("SCHEDULE_TOPIC_XXXX" in x for x in lines)
    assert all(x.startswith("send from 127.0.0.1 refused: ") for x in lines)
    assert rpc.send("Good", b"ok").code == ResponseCode.SUCCESS  # the client is still served


def test_rate_limit_window_and_skipped_count(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    log = RefusalLog(logging.getLogger("test.refusals"), "send", interval=60.0, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="test.refusals")
    bad = MessageIllegalError("header field flag = 4294967296 is out of range")
    assert log.refused("10.0.0.1:5000", bad)
    assert not log.refused("10.0.0.1:5001", MessageIllegalError("header field flag = 4294967297 is out of range"))
    assert log.refused("10.0.0.2:5000", bad)  # another client
    assert log.refused("10.0.0.1:5000", NoPermissionError("Sending message to topic[X] is forbidden."))  # reason
    now[0] += 61.0
    assert log.refused("10.0.0.1:5000", bad)
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 4 and "1 more like it" in msgs[-1]


def test_remembered_pairs_are_bounded() -> None:
    log = RefusalLog(logging.getLogger("test.refusals"), "send", max_remembered=8, clock=lambda: 0.0)
    for i in range(100):
        log.refused(f"10.0.{i}.1:1", NoPermissionError("no"))
    assert len(log._seen) <= 8
