"""Tag subscriptions (``*`` or ``TagA || TagB``), matched exactly on consume-queue tag codes.

Parsing is RocketMQ's ``FilterAPI.buildSubscriptionData``: null, empty or ``*``
subscribe to everything; otherwise split on ``||``, trim each part as Java's
``String.trim`` does (every char <= U+0020) and drop empty parts.

Codes: Sluice's consume queue keeps ``tagcode.tag_code`` (Java hash in the low
32 bits, an independent 31-bit hash above), so the broker compares full 64-bit
codes and colliding tags such as "Aa"/"BB" do not pass. A code whose value lies
in [-2**31, 2**32) carries no second hash: it is a bare Java ``String.hashCode``
(what RocketMQ itself stores, widened signed or masked to 32 bits). For such a
*legacy* code the selector falls back to RocketMQ's rule — its low 32 bits must
equal the Java hash of a subscribed tag — accepting the same collisions
RocketMQ does; the client's exact re-check (``matches``) removes them. Code 0
(no tag) never matches a tag list.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from sluice.errors import FilterEvaluationError
from sluice.filter.base import Selector
from sluice.filter.sql_interp import Explanation
from sluice.filter.tagcode import java_string_hash, tag_code

SUB_ALL = "*"
TAGS_PROPERTY = "TAGS"
_JAVA_TRIM = "".join(chr(c) for c in range(33))
_LEGACY_LOW = -(2**31)
_LEGACY_HIGH = 2**32


def parse_tag_subscription(subscription: str | None) -> tuple[str, ...] | None:
    """The tags of a subscription, in order, de-duplicated; None means ``*`` (everything).

    As in RocketMQ only None, ``""`` and exactly ``"*"`` subscribe to everything;
    a string of separators and blanks ("||", "  ") yields no tags and so matches nothing.
    """
    if subscription is None or subscription == "" or subscription == SUB_ALL:
        return None
    if not isinstance(subscription, str):
        raise TypeError(f"a tag subscription must be a str, not {type(subscription).__name__}")
    tags: dict[str, None] = {}
    for part in subscription.split("||"):
        tag = part.strip(_JAVA_TRIM)
        if tag:
            tags.setdefault(tag, None)
    return tuple(tags)


def is_legacy_code(code: int) -> bool:
    """True for a code that is only a Java hash (no Sluice second hash above it)."""
    return _LEGACY_LOW <= code < _LEGACY_HIGH


class TagSelector(Selector):
    """A TAG subscription. ``sub_all`` is True for ``*`` (also for None/empty, as in RocketMQ)."""

    expression_type = "TAG"

    def __init__(self, expression: str | None) -> None:
        parsed = parse_tag_subscription(expression)
        self.sub_all = parsed is None
        self.tags: tuple[str, ...] = parsed or ()
        self.expression = SUB_ALL if self.sub_all else expression  # type: ignore[assignment]
        self.tag_set = frozenset(self.tags)
        self.codes = np.array(sorted({tag_code(t) for t in self.tags}), dtype=np.int64)
        self.java_hashes = np.array(sorted({java_string_hash(t) & 0xFFFFFFFF for t in self.tags}), dtype=np.int64)
        self._code_set = frozenset(int(c) for c in self.codes)
        self._java_set = frozenset(int(h) for h in self.java_hashes)

    @classmethod
    def from_tags(cls, tags: Iterable[str]) -> TagSelector:
        return cls(" || ".join(tags))

    # -- client/broker re-check on the tag string ------------------------------------------------
    def evaluate(self, properties: Mapping[str, str]) -> bool | None:
        if self.sub_all:
            return True
        try:
            return properties.get(TAGS_PROPERTY) in self.tag_set
        except (TypeError, AttributeError) as exc:
            raise FilterEvaluationError(f"cannot read TAGS: {exc}") from exc

    def matches(self, properties: Mapping[str, str]) -> bool:
        if self.sub_all:
            return True
        try:
            return properties.get(TAGS_PROPERTY) in self.tag_set
        except (TypeError, AttributeError):
            return False

    # -- consume-queue codes ---------------------------------------------------------------------
    def matches_code(self, code: int) -> bool:
        """One consume-queue tag code (see the module docstring for legacy Java-hash codes)."""
        if self.sub_all:
            return True
        if code in self._code_set:
            return True
        return code != 0 and is_legacy_code(code) and (code & 0xFFFFFFFF) in self._java_set

    def match_codes(self, codes: np.ndarray) -> np.ndarray:
        """A bool mask over an int64 array of tag codes (vectorised; no Python loop per code)."""
        codes = np.asarray(codes, dtype=np.int64)
        if self.sub_all:
            return np.ones(codes.shape, dtype=bool)
        mask = np.isin(codes, self.codes)
        legacy = (codes >= _LEGACY_LOW) & (codes < _LEGACY_HIGH) & (codes != 0)
        if legacy.any():
            mask |= legacy & np.isin(codes & 0xFFFFFFFF, self.java_hashes)
        return mask

    def matches_batch(self, batch: Sequence[Mapping[str, str]]) -> np.ndarray:
        if self.sub_all:
            return np.ones(len(batch), dtype=bool)
        tags = self.tag_set
        return np.fromiter((p.get(TAGS_PROPERTY) in tags for p in batch), dtype=bool, count=len(batch))

    def explain(self, properties: Mapping[str, str]) -> Explanation:
        if self.matches(properties):
            return Explanation(self.expression, True, "TRUE")
        tag = properties.get(TAGS_PROPERTY) if hasattr(properties, "get") else None
        reason = "message has no tag" if tag is None else f"tag {tag!r} is not one of {list(self.tags)}"
        return Explanation(self.expression, False, "FALSE", self.expression, "FALSE", reason,
                           missing=(TAGS_PROPERTY,) if tag is None else ())
