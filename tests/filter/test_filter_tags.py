"""Tag subscriptions: RocketMQ parsing, exact 64-bit code matching, legacy Java-hash codes."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.filter import TagSelector, compile_selector, java_string_hash, parse_tag_subscription, tag_code


@pytest.mark.parametrize(("subscription", "tags"), [
    (None, None), ("", None), ("*", None),
    ("TagA", ("TagA",)), ("TagA || TagB", ("TagA", "TagB")), (" TagA ||TagB|| ", ("TagA", "TagB")),
    ("TagA||TagA", ("TagA",)), ("||", ()), ("  ", ()), (" * ", ("*",)), ("a|b", ("a|b",)),
    ("\x00TagA\x1f", ("TagA",)),  # Java trim strips every char <= U+0020
    ("a ||| b", ("a", "| b")),
])
def test_parse_like_filter_api(subscription: str | None, tags: tuple[str, ...] | None) -> None:
    assert parse_tag_subscription(subscription) == tags


def test_type_defaults_to_tag() -> None:
    for type_name in (None, "", "TAG", "tag", " Tag "):
        selector = compile_selector(type_name, "TagA || TagB")  # type: ignore[arg-type]
        assert isinstance(selector, TagSelector)
        assert selector.tags == ("TagA", "TagB")


def test_string_recheck_is_exact() -> None:
    selector = compile_selector("TAG", "Aa")
    assert selector.matches({"TAGS": "Aa"})
    assert not selector.matches({"TAGS": "BB"})  # same Java hash
    assert not selector.matches({})
    assert not selector.matches({"TAGS": "aa"})
    everything = compile_selector("TAG", "*")
    assert everything.matches({}) and everything.matches({"TAGS": "x"})
    assert everything.evaluate({}) is True
    assert not compile_selector("TAG", "||").matches({"TAGS": "x"})
    assert selector.matches(None) is False  # type: ignore[arg-type]


def test_codes_match_exactly_despite_java_collisions() -> None:
    assert java_string_hash("Aa") == java_string_hash("BB")
    selector = TagSelector("Aa || TagB")
    codes = np.array([tag_code("Aa"), tag_code("BB"), tag_code("TagB"), tag_code("TagC"), 0], dtype=np.int64)
    assert selector.match_codes(codes).tolist() == [True, False, True, False, False]
    assert [selector.matches_code(int(c)) for c in codes] == [True, False, True, False, False]


def test_legacy_java_hash_codes() -> None:
    """A bare Java hash (signed-widened or masked to 32 bits) matches by hash, like RocketMQ."""
    selector = TagSelector("Aa || payment")
    neg = java_string_hash("payment")
    assert neg < 0
    legacy = [java_string_hash("Aa"), java_string_hash("BB"), neg & 0xFFFFFFFF, java_string_hash("other")]
    if neg < 0:
        legacy.append(neg)
    mask = selector.match_codes(np.array(legacy, dtype=np.int64))
    assert mask.tolist()[:4] == [True, True, True, False]  # "BB" collides, as in RocketMQ
    if neg < 0:
        assert mask.tolist()[4]  # the signed-widened form RocketMQ stores
    assert selector.matches_code(java_string_hash("Aa"))
    # ConsumeQueueExt addresses (far below -2**31) are not tag codes.
    assert not selector.matches_code(-(2**63) + 5)


def test_untagged_code_never_matches_a_tag_list() -> None:
    selector = TagSelector("\x00x")  # trimmed to "x"
    assert not selector.match_codes(np.zeros(3, dtype=np.int64)).any()
    assert TagSelector("*").match_codes(np.zeros(3, dtype=np.int64)).all()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=5), st.lists(st.text(max_size=8), max_size=30))
def test_code_mask_agrees_with_tag_strings(subscribed: list[str], message_tags: list[str]) -> None:
    subscribed = [t for t in subscribed if "||" not in t and t.strip("".join(map(chr, range(33)))) == t]
    if not subscribed:
        return
    selector = TagSelector.from_tags(subscribed)
    codes = np.array([tag_code(t) for t in message_tags], dtype=np.int64)
    expected = [t in set(subscribed) for t in message_tags]
    assert selector.match_codes(codes).tolist() == expected
    assert selector.matches_batch([{"TAGS": t} for t in message_tags]).tolist() == expected


def test_mask_over_a_million_codes_is_vectorised() -> None:
    rng = np.random.default_rng(7)
    pool = np.array([tag_code(f"tag{i}") for i in range(50)], dtype=np.int64)
    codes = pool[rng.integers(0, 50, size=1_000_000)]
    selector = TagSelector("tag3 || tag7")
    mask = selector.match_codes(codes)
    assert mask.sum() == np.isin(codes, [tag_code("tag3"), tag_code("tag7")]).sum()


def test_explain_tags() -> None:
    selector = TagSelector("TagA")
    assert "not one of" in str(selector.explain({"TAGS": "TagB"}))
    assert selector.explain({}).missing == ("TAGS",)
    assert selector.explain({"TAGS": "TagA"}).matched
