"""Fixtures: in-process brokers on free loopback ports (the factory is tests/conftest.py's ``make_broker``;
this folder's handle and raw client are in broker_support.py)."""
from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
from broker_support import BrokerHandle, Rpc


@pytest.fixture
def make_broker(make_broker: Callable[..., Any]) -> Callable[..., BrokerHandle]:
    return partial(make_broker, handle=BrokerHandle)


@pytest.fixture
def broker(make_broker: Callable[..., BrokerHandle]) -> BrokerHandle:
    return make_broker()


@pytest.fixture
def rpc(broker: BrokerHandle) -> Rpc:
    return broker.rpc()
