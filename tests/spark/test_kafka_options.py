"""The source's Kafka-shaped options, the writer's row mapping and ids, without Spark sessions or a broker."""
from __future__ import annotations

import logging
from array import array

import pytest

pytest.importorskip("pyspark")

from pyspark.sql import Row  # noqa: E402

from sluice.errors import InvalidParameterError, SelectorSyntaxError  # noqa: E402
from sluice.spark.options import READ_OPTIONS, Options, parse_offsets, resolve_table, warn_unknown  # noqa: E402
from sluice.spark.selector import check_selector  # noqa: E402
from sluice.spark.stream import flatten, nest, offsets_behind  # noqa: E402
from sluice.spark.writer import SentCount, content_digest, message_id, row_message, unsent_twins  # noqa: E402

ONE = {"Orders": [("broker-a", 0), ("broker-a", 1)]}
TWO = {"Orders": [("broker-a", 0), ("broker-b", 0)]}


def test_kafka_offsets_json_by_topic_then_queue():
    assert parse_offsets('{"Orders": {"0": 400, "1": -2}}', "startingOffsets") == {"Orders": {"0": 400, "1": -2}}
    assert parse_offsets("Earliest", "s") == "earliest"
    table = parse_offsets('{"Orders": {"0": 400, "broker-a:1": -1}}', "s")
    assert resolve_table(table, "s", ONE) == {("Orders", "broker-a", 0): 400, ("Orders", "broker-a", 1): -1}


@pytest.mark.parametrize("spec, queues, match", [
    ('{"Orderz": {"0": 1}}', ONE, "names topic 'Orderz'"),
    ('{"Orders": {"broker-x:0": 1}}', ONE, "no broker 'broker-x'"),
    ('{"Orders": {"7": 1}}', ONE, "no queue 7"),
    ('{"Orders": {"0": 1}}', TWO, "ambiguous"),
    ('{"Orders": {"zero": 1}}', ONE, "not a queue"),
])
def test_unknown_topic_broker_or_queue_is_an_error_naming_it(spec, queues, match):
    with pytest.raises(InvalidParameterError, match=match):
        resolve_table(parse_offsets(spec, "startingOffsets"), "startingOffsets", queues)


@pytest.mark.parametrize("spec, match", [
    ('{"broker-a": {"0": {"x": 1}}}', "offset"), ('{"Orders": 5}', "must map to"), ("[1]", "map topics"),
    ('{"Orders": {"0": -3}}', "-2"), ("soonest", "earliest, latest or JSON"),
])
def test_malformed_offsets_are_refused(spec, match):
    with pytest.raises(InvalidParameterError, match=match):
        parse_offsets(spec, "startingOffsets")
    with pytest.raises(InvalidParameterError, match="earliest"):
        parse_offsets('{"Orders": {"0": -2}}', "endingOffsets", ending=True)


def test_subscription_options():
    assert Options({"namesrv": "n:1", "subscribe": "A, B,A"}).subscription.topics == ("A", "B")
    assert Options({"namesrv": "n:1", "subscribePattern": "Ord.*"}).subscription.pattern == "Ord.*"
    with pytest.raises(InvalidParameterError, match="topic, subscribe"):
        Options({"namesrv": "n:1"})
    with pytest.raises(InvalidParameterError, match="only one"):
        Options({"namesrv": "n:1", "topic": "A", "subscribe": "B"})
    with pytest.raises(InvalidParameterError, match="regular expression"):
        Options({"namesrv": "n:1", "subscribePattern": "(["})
    with pytest.raises(InvalidParameterError, match="names topic 'C'"):
        Options({"namesrv": "n:1", "subscribe": "A,B", "startingOffsets": '{"C": {"0": 1}}'})
    with pytest.raises(InvalidParameterError, match="both accessKey and secretKey"):
        Options({"namesrv": "n:1", "topic": "A", "accessKey": "k"})
    o = Options({"namesrv": "n:1", "topic": "A", "accessKey": "k", "secretKey": "s3cr"})
    assert o.credentials.access_key == "k" and "s3cr" not in repr(o.credentials)
    assert o.describe() == "Sluice[A TAG:*]"


def test_unknown_options_are_warned(caplog):
    with caplog.at_level(logging.WARNING, logger="sluice.spark.options"):
        assert warn_unknown({"namesrv": "x", "startingoffset": "earliest"}, READ_OPTIONS, "reading") == \
            ["startingoffset"]
    [rec] = caplog.records
    assert "startingoffset (a typo?)" in rec.getMessage() and "startingOffsets" in rec.getMessage()
    assert warn_unknown({"namesrv": "x", "maxoffsetspertrigger": "5"}, READ_OPTIONS, "reading") == []


def test_selector_naming_tags_fails_loudly_with_caret():
    with pytest.raises(SelectorSyntaxError, match="TAGS"):
        check_selector("SQL92", "tags = 'Paid'")
    with pytest.raises(SelectorSyntaxError) as e:
        check_selector("SQL92", "a >> 3")
    first, excerpt, caret = str(e.value).split("\n")
    assert first.startswith("option selector: Invalid SQL92 selector") and excerpt.strip() == "a >> 3"
    assert caret.strip() == "^"
    check_selector("SQL92", "TAGS = 'Paid' AND a > 1")
    from sluice.spark.selector import selector_column

    with pytest.raises(SelectorSyntaxError, match="TAGS"):  # the Spark-side twin refuses it too
        selector_column("a > 1 AND Tags = 'Paid'")
    check_selector("TAG", "tags || Paid")  # a TAG expression is just tag names


def test_kafka_columns_are_mapped():
    row = Row(value=b"v", key=b"k1", headers=[Row(key="h", value=b"x"), Row(key="UNIQ_KEY", value=b"no")],
              tags="T").asDict(recursive=False)
    assert row_message(row, "Top") == ("Top", b"v", "T", ["k1"], {"h": "x"})
    with pytest.raises(InvalidParameterError, match="UTF-8"):
        row_message({"value": b"v", "headers": [("h", b"\xff")]}, "Top")
    with pytest.raises(InvalidParameterError, match="non-null body"):
        row_message({"value": None}, "Top")


def test_ids_follow_content_not_position():
    d1 = content_digest("T", b"x", None, [], {"a": "1"})
    assert d1 == content_digest("T", b"x", None, [], {"a": "1"})
    assert d1 != content_digest("T", b"x", None, [], {"a": "2"}) != content_digest("T", b"x", "t", [], {"a": "1"})
    assert message_id("w", d1, 0) == message_id("w", d1, 0) != message_id("w", d1, 1) != message_id("v", d1, 1)
    d2 = b"\x01" * 16
    msgs = [SentCount(0, 3, d1 + d2, array("I", [2, 1]).tobytes(), array("I", [0, 0]).tobytes(), ("T",)),
            SentCount(1, 3, d1, array("I", [3]).tobytes(), array("I", [0]).tobytes(), ("T",)), None]
    # d1: 2 copies in task 0, 3 in task 1: task 1 sent occurrences 0..2, the driver adds 3 and 4
    assert unsent_twins(msgs) == {d1: ("T", 3, 5)} and unsent_twins(msgs[:1]) == {}


def test_stream_offsets_and_lag():
    flat = {("A", "b:0"): 5, ("A", "b:1"): 7, ("B", "b:0"): 1}
    assert flatten(nest(flat)) == flat
    assert flatten({"b:0": 3}, "A") == {("A", "b:0"): 3}  # a checkpoint of an earlier version
    with pytest.raises(InvalidParameterError, match="several topics"):
        flatten({"b:0": 3}, None)
    lag = offsets_behind({("A", "b:0"): 5, ("A", "b:1"): 7}, {("A", "b:0"): 9, ("A", "b:1"): 7})
    assert lag == {"avgOffsetsBehindLatest": 2.0, "maxOffsetsBehindLatest": 4, "minOffsetsBehindLatest": 0}
