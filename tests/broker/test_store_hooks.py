"""The broker's store plug-ins implement the store's contracts (store/types.py MessageFilter, Dispatcher)."""
from __future__ import annotations

import inspect

import pytest

from sluice.broker.bitmap import CalcBitmapDispatcher
from sluice.broker.filter_data import ConsumerFilterManager
from sluice.broker.filtering import SelectorFilter, compile_subscription
from sluice.broker.longpoll import HoldService
from sluice.broker.retry import RetryTopicFilter
from sluice.filter import BloomFilter, compile_selector
from sluice.store.types import Dispatcher, MessageFilter


def _members(proto: type) -> list[str]:
    return [n for n, v in vars(proto).items() if not n.startswith("_") and callable(v)] + list(proto.__annotations__)


def _arity(fn) -> int:  # type: ignore[no-untyped-def]
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in inspect.signature(fn).parameters.values())


def _conforms(obj: object, proto: type) -> None:
    assert isinstance(obj, proto)
    for name in _members(proto):
        want = getattr(proto, name, None)
        if callable(want):  # the store calls hooks positionally: same number of arguments
            assert _arity(getattr(obj, name)) == _arity(want) - 1, (type(obj).__name__, name)


@pytest.mark.parametrize("make", [
    lambda: SelectorFilter(compile_selector("TAG", "a || b")),
    lambda: SelectorFilter(compile_selector("SQL92", "n > 1")),
    lambda: SelectorFilter(compile_selector("SQL92", "n > 1")).for_pull(None),
    lambda: compile_subscription("T", "TAG", "*", 1, enable_property_filter=False).filter,
    lambda: RetryTopicFilter(None, "G"),  # type: ignore[arg-type]
], ids=["tag", "sql", "sql-for-pull", "subscription", "retry"])
def test_broker_filters_are_store_message_filters(make) -> None:  # type: ignore[no-untyped-def]
    _conforms(make(), MessageFilter)


def test_broker_dispatchers_are_store_dispatchers() -> None:
    bitmaps = CalcBitmapDispatcher(ConsumerFilterManager(None, bloom=BloomFilter(20, 32)))
    hold = HoldService(lambda topic, qid: 0)
    _conforms(bitmaps, Dispatcher)
    _conforms(hold, Dispatcher)
    assert bitmaps.rebuilds_bitmaps and not hold.rebuilds_bitmaps
