"""MessageSelector: what a consumer subscribes to, validated when it is built.

``MessageSelector.by_tag("TagA || TagB")`` and ``MessageSelector.by_sql("a > 5")``
compile through :func:`sluice.filter.compile_selector`, so a bad SQL92
expression raises SelectorSyntaxError (with ``.position``) before anything is
sent to a broker.

``MessageSelector.by_class("module:ClassName", source=None)`` is RocketMQ's
class-filter mode (DefaultMQPushConsumerImpl.subscribe(topic, fullClassName,
filterClassSource)): the class is registered with the filter servers beside the
topic's brokers and pulls go to them (docs/filtering.md, "Class filters").
"""
from __future__ import annotations

import re
import time
import zlib

from sluice.errors import InvalidParameterError
from sluice.filter import Selector, TagSelector, compile_selector, java_string_hash
from sluice.protocol.bodies import SubscriptionData

__all__ = ["MessageSelector", "as_selector"]

TAG = "TAG"
SQL92 = "SQL92"
#: Sluice's name for class-filter mode; on the wire it is a TAG subscription with classFilterMode=true.
CLASS = "CLASS"

_SINGLE_PIPE = re.compile(r"(?<!\|)\|(?!\|)")
_CLASS_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")


def class_source_crc(source: bytes) -> int:
    """The classCRC a registration carries: CRC32 of the source masked to 31 bits, what RocketMQ's clients send
    (UtilAll.crc32, common/src/main/java/org/apache/rocketmq/common/UtilAll.java), so a RocketMQ filter server
    and Sluice's (which accepts this or the full CRC32) both take it; 0 for no source."""
    return zlib.crc32(source) & 0x7FFFFFFF if source else 0


class MessageSelector:
    """An expression type (TAG or SQL92) and its expression, compiled once."""

    __slots__ = ("class_crc", "class_source", "compiled", "expression", "expression_type")

    def __init__(self, expression_type: str, expression: str | None) -> None:
        kind = (expression_type or TAG).upper()
        if kind == CLASS:
            raise InvalidParameterError("build a class filter with MessageSelector.by_class(name, source)")
        if kind == TAG and expression and _SINGLE_PIPE.search(expression):
            # RocketMQ splits tags on "||" only, so "TagA | TagB" is one tag no message has: zero results
            # from a typo. The SDK refuses it (the broker still serves such a subscription from other clients).
            raise InvalidParameterError(
                f"tag expression {expression!r} has a single '|': tags are separated by '||', as in "
                f"'TagA || TagB' (the SDK does not subscribe to tags that contain '|')")
        self.compiled: Selector = compile_selector(kind, expression)
        self.expression_type = kind
        # A TAG selector normalises None/"" to "*", as FilterAPI.buildSubscriptionData does.
        self.expression: str = self.compiled.expression if kind == TAG else str(expression)
        self.class_source = b""
        self.class_crc = 0

    @classmethod
    def by_tag(cls, expression: str | None = "*") -> MessageSelector:
        """``"*"`` (everything) or ``"TagA || TagB"``."""
        return cls(TAG, expression)

    @classmethod
    def by_sql(cls, expression: str) -> MessageSelector:
        """A SQL92 property expression, e.g. ``"a > 5 AND region IN ('eu', 'us')"``."""
        return cls(SQL92, expression)

    @classmethod
    def by_class(cls, class_name: str, source: str | bytes | None = None) -> MessageSelector:
        """A filter class run by the filter servers beside the brokers: ``"module:ClassName"`` names a
        ``sluice.filter.MessageFilter`` subclass. ``source`` is the module's text, used only where the
        operator enabled uploads (``filter_class_uploads``); without it the servers load the class from
        their repository. Messages reach the consumer only through a filter server."""
        if not isinstance(class_name, str) or not _CLASS_NAME.fullmatch(class_name):
            raise InvalidParameterError(f"a filter class is named 'module:ClassName' (module dotted, both "
                                        f"Python identifiers), not {class_name!r}")
        if source is None:
            raw = b""
        elif isinstance(source, str):
            raw = source.encode("utf-8")
        elif isinstance(source, (bytes, bytearray, memoryview)):
            raw = bytes(source)
        else:
            raise InvalidParameterError(f"a filter class source is str or bytes, not {type(source).__name__}")
        self = cls.by_tag("*")
        self.expression_type = CLASS
        self.expression = class_name
        self.class_source = raw
        self.class_crc = class_source_crc(raw)
        return self

    @property
    def is_tag(self) -> bool:
        return self.expression_type == TAG

    @property
    def is_class(self) -> bool:
        """Class-filter mode: pulled from filter servers, registered with REGISTER_MESSAGE_FILTER_CLASS."""
        return self.expression_type == CLASS

    @property
    def wire_expression_type(self) -> str:
        """The expressionType pulls and heartbeats carry: TAG for a class filter, as in RocketMQ."""
        return TAG if self.expression_type == CLASS else self.expression_type

    @property
    def tags(self) -> frozenset[str]:
        """The tags a TAG selector names (empty for ``*`` and for SQL92): the client re-check set."""
        c = self.compiled
        return c.tag_set if isinstance(c, TagSelector) else frozenset()

    def subscription_data(self, topic: str, sub_version: int | None = None) -> SubscriptionData:
        """The SubscriptionData a heartbeat carries; code_set holds Java hashes as Java clients send.
        A class filter: subString is the class name, classFilterMode true, no tags (FilterAPI with "*")."""
        tags = sorted(self.tags)
        return SubscriptionData(
            topic=topic, sub_string=self.expression, tags_set=tags, class_filter_mode=self.is_class,
            code_set=[java_string_hash(t) for t in tags],
            sub_version=int(time.time() * 1000) if sub_version is None else sub_version,
            expression_type=self.wire_expression_type,
        )

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, MessageSelector) and other.expression_type == self.expression_type
                and other.expression == self.expression and other.class_crc == self.class_crc)

    def __hash__(self) -> int:
        return hash((self.expression_type, self.expression, self.class_crc))

    def __repr__(self) -> str:
        if self.is_class:
            return f"MessageSelector.by_class({self.expression!r}, <{len(self.class_source)} bytes>)"
        return f"MessageSelector({self.expression_type!r}, {self.expression!r})"


def as_selector(selector: MessageSelector | str | None) -> MessageSelector:
    """Accept a MessageSelector, a tag expression string (RocketMQ's ``subExpression``) or None for ``*``."""
    if isinstance(selector, MessageSelector):
        return selector
    if selector is None or isinstance(selector, str):
        return MessageSelector.by_tag(selector)
    raise TypeError(f"a selector must be a MessageSelector or a tag expression, not {type(selector).__name__}")
