"""MessageSelector: what a consumer subscribes to, validated when it is built.

``MessageSelector.by_tag("TagA || TagB")`` and ``MessageSelector.by_sql("a > 5")``
compile through :func:`sluice.filter.compile_selector`, so a bad SQL92
expression raises SelectorSyntaxError (with ``.position``) before anything is
sent to a broker.
"""
from __future__ import annotations

import time

from sluice.filter import Selector, TagSelector, compile_selector, java_string_hash
from sluice.protocol.bodies import SubscriptionData

__all__ = ["MessageSelector", "as_selector"]

TAG = "TAG"
SQL92 = "SQL92"


class MessageSelector:
    """An expression type (TAG or SQL92) and its expression, compiled once."""

    __slots__ = ("compiled", "expression", "expression_type")

    def __init__(self, expression_type: str, expression: str | None) -> None:
        kind = (expression_type or TAG).upper()
        self.compiled: Selector = compile_selector(kind, expression)
        self.expression_type = kind
        # A TAG selector normalises None/"" to "*", as FilterAPI.buildSubscriptionData does.
        self.expression: str = self.compiled.expression if kind == TAG else str(expression)

    @classmethod
    def by_tag(cls, expression: str | None = "*") -> MessageSelector:
        """``"*"`` (everything) or ``"TagA || TagB"``."""
        return cls(TAG, expression)

    @classmethod
    def by_sql(cls, expression: str) -> MessageSelector:
        """A SQL92 property expression, e.g. ``"a > 5 AND region IN ('eu', 'us')"``."""
        return cls(SQL92, expression)

    @property
    def is_tag(self) -> bool:
        return self.expression_type == TAG

    @property
    def tags(self) -> frozenset[str]:
        """The tags a TAG selector names (empty for ``*`` and for SQL92): the client re-check set."""
        c = self.compiled
        return c.tag_set if isinstance(c, TagSelector) else frozenset()

    def subscription_data(self, topic: str, sub_version: int | None = None) -> SubscriptionData:
        """The SubscriptionData a heartbeat carries; code_set holds Java hashes as Java clients send."""
        tags = sorted(self.tags)
        return SubscriptionData(
            topic=topic, sub_string=self.expression, tags_set=tags,
            code_set=[java_string_hash(t) for t in tags],
            sub_version=int(time.time() * 1000) if sub_version is None else sub_version,
            expression_type=self.expression_type,
        )

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, MessageSelector) and other.expression_type == self.expression_type
                and other.expression == self.expression)

    def __hash__(self) -> int:
        return hash((self.expression_type, self.expression))

    def __repr__(self) -> str:
        return f"MessageSelector({self.expression_type!r}, {self.expression!r})"


def as_selector(selector: MessageSelector | str | None) -> MessageSelector:
    """Accept a MessageSelector, a tag expression string (RocketMQ's ``subExpression``) or None for ``*``."""
    if isinstance(selector, MessageSelector):
        return selector
    if selector is None or isinstance(selector, str):
        return MessageSelector.by_tag(selector)
    raise TypeError(f"a selector must be a MessageSelector or a tag expression, not {type(selector).__name__}")
