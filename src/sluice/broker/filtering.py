"""Subscriptions → store filters: the adapter between the filter package and the store's MessageFilter hook.

A TAG subscription filters on consume-queue units alone (``match_units`` is the
tag selector's exact batch mask; no commit-log reads). A SQL92 subscription
passes every unit and decides per candidate on its stored properties
(``match_record``). Compile errors are raised, never turned into "match all".
The next step (Bloom bitmaps in ConsumeQueueExt) plugs in here: a SQL filter
can then also answer ``match_units`` from the bitmaps.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sluice.errors import SluiceError
from sluice.filter import Selector, TagSelector, compile_selector
from sluice.protocol.bodies import SubscriptionData
from sluice.protocol.codes import ResponseCode

__all__ = ["CompiledSubscription", "SelectorFilter", "compile_subscription", "is_tag_type", "SQL92_DISABLED"]

SQL92_DISABLED = ("The broker does not support consumer to filter message by SQL92 "
                  "(enable_property_filter is off in the broker config)")


def is_tag_type(expression_type: str | None) -> bool:
    """ExpressionType.isTagType: null, empty and TAG (any case) are tags."""
    return not expression_type or expression_type.upper() == "TAG"


class SqlFilterDisabledError(SluiceError):
    """A SQL92 subscription on a broker with enable_property_filter off (RocketMQ answers SYSTEM_ERROR)."""

    code = ResponseCode.SYSTEM_ERROR


class SelectorFilter:
    """The store's MessageFilter for one compiled selector."""

    __slots__ = ("selector", "needs_record", "_tag")

    def __init__(self, selector: Selector) -> None:
        self.selector = selector
        self._tag = selector if isinstance(selector, TagSelector) else None
        self.needs_record = self._tag is None

    def match_units(self, tag_codes: np.ndarray) -> np.ndarray | None:
        if self._tag is None:
            return None
        if self._tag.sub_all:
            return None
        return self._tag.match_codes(tag_codes)

    def match_record(self, properties: dict[str, str]) -> bool:
        return self.selector.matches(properties)

    def match_dispatch(self, tag_code: int, properties: dict[str, str]) -> bool:
        """Would a just-dispatched message pass? (wakes held pulls only for messages they want)."""
        if self._tag is not None:
            return self._tag.matches_code(tag_code)
        return self.selector.matches(properties)

    @property
    def passes_all(self) -> bool:
        return self._tag is not None and self._tag.sub_all


@dataclass(frozen=True, slots=True)
class CompiledSubscription:
    """A subscription as the broker keeps it: the client's data plus the server-compiled filter."""

    topic: str
    expression_type: str
    expression: str
    sub_version: int
    tags: tuple[str, ...]
    filter: SelectorFilter

    def to_wire(self) -> dict:
        """SubscriptionData JSON, with tag codes recomputed on the server (Java hashes, as clients expect)."""
        from sluice.filter import java_string_hash
        return {
            "topic": self.topic, "subString": self.expression, "classFilterMode": False,
            "tagsSet": list(self.tags), "codeSet": [java_string_hash(t) for t in self.tags],
            "subVersion": self.sub_version, "expressionType": self.expression_type,
        }


def compile_subscription(topic: str, expression_type: str | None, expression: str | None, sub_version: int,
                         *, enable_property_filter: bool) -> CompiledSubscription:
    """Compile what a client subscribed; SelectorSyntaxError (SUBSCRIPTION_PARSE_FAILED) on a bad expression.

    Tag codes are always recomputed from the expression: librocketmq sends ``codeSet: [0, 0]``.
    """
    etype = "TAG" if is_tag_type(expression_type) else str(expression_type).upper()
    if etype == "SQL92" and not enable_property_filter:
        raise SqlFilterDisabledError(SQL92_DISABLED)
    selector = compile_selector(etype, expression)
    tags = selector.tags if isinstance(selector, TagSelector) else ()
    return CompiledSubscription(topic, etype, selector.expression if etype == "TAG" else (expression or ""),
                                sub_version, tags, SelectorFilter(selector))


def compile_subscription_data(sd: SubscriptionData, *, enable_property_filter: bool) -> CompiledSubscription:
    return compile_subscription(sd.topic, sd.expression_type, sd.sub_string, sd.sub_version,
                                enable_property_filter=enable_property_filter)
