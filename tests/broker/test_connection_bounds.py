"""The broker's connection bounds come from BrokerConfig: idle timeout (a held pull is activity), connection
limit, frame budget (their behaviour over sockets: tests/transport/test_limits.py)."""
from __future__ import annotations

import socket
from collections.abc import Callable

import pytest
from broker_support import BrokerHandle

from sluice.broker.config import BrokerConfig
from sluice.errors import InvalidParameterError
from sluice.protocol.codes import ResponseCode


def test_defaults_and_validation() -> None:
    c = BrokerConfig()
    assert (c.frame_budget, c.max_connections, c.server_channel_max_idle_time_seconds) == (64 << 20, 4096, 120.0)
    for bad in ({"frame_budget": 0}, {"max_connections": 0}, {"server_channel_max_idle_time_seconds": -1}):
        with pytest.raises(InvalidParameterError):
            BrokerConfig.load(None, **bad)


def test_idle_connections_close_but_a_held_pull_keeps_its_connection(
        make_broker: Callable[..., BrokerHandle]) -> None:
    b = make_broker(server_channel_max_idle_time_seconds=0.4, max_connections=8, frame_budget=1 << 20)
    server = b.broker.server
    assert (server.idle_timeout, server.max_connections, server.budget.limit) == (0.4, 8, 1 << 20)
    rpc = b.rpc()
    assert rpc.send("IdleT").code == ResponseCode.SUCCESS
    # Held past the idle timeout (nothing arrives), answered PULL_NOT_FOUND on the same, still open connection.
    resp = rpc.pull("IdleT", offset=1, suspend_ms=1500)
    assert resp.code == ResponseCode.PULL_NOT_FOUND
    assert server.idle_closed == 0
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as silent:
        assert silent.recv(1) == b""  # closed for idleness (the timeout only bounds the wait)
    assert server.idle_closed >= 1  # the rpc connection, quiet meanwhile, goes too
