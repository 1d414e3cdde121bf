"""Typed headers and JSON bodies: round trips, lenient reading, precise errors."""
from __future__ import annotations

import dataclasses
import typing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.errors import InvalidParameterError
from sluice.protocol import bodies as B
from sluice.protocol import headers as H
from sluice.protocol.codes import RequestCode
from sluice.protocol.command import RemotingCommand

HEADER_CLASSES = [c for c in vars(H).values()
                  if isinstance(c, type) and issubclass(c, H.Header) and c is not H.Header]
BODY_CLASSES = [c for c in vars(B).values() if isinstance(c, type) and dataclasses.is_dataclass(c)]

longs = st.integers(-2**63, 2**63 - 1)
words = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)


def strategy_for(tp: typing.Any) -> st.SearchStrategy[typing.Any]:
    if typing.get_origin(tp) in (typing.Union, __import__("types").UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return st.none() | strategy_for(args[0])
    if tp is int:
        return longs
    if tp is str:
        return words
    if tp is bool:
        return st.booleans()
    origin = typing.get_origin(tp)
    if origin is list:
        return st.lists(strategy_for(typing.get_args(tp)[0]), max_size=3)
    if origin is dict:
        k, v = typing.get_args(tp)
        return st.dictionaries(strategy_for(k), strategy_for(v), max_size=3)
    if dataclasses.is_dataclass(tp):
        return instances(tp)
    raise TypeError(tp)


def instances(cls: type) -> st.SearchStrategy[typing.Any]:
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        strat = strategy_for(hints[f.name])
        if f.metadata.get("enum"):
            strat = st.sampled_from(f.metadata["enum"])
        kwargs[f.name] = strat
    return st.builds(cls, **kwargs)


@pytest.mark.parametrize("cls", HEADER_CLASSES, ids=lambda c: c.__name__)
@settings(derandomize=True)  # deterministic runs; widen max_examples locally to fuzz harder
@given(data=st.data())
def test_header_round_trip(cls: type[H.Header], data: st.DataObject) -> None:
    header = data.draw(instances(cls))
    if any(getattr(header, f.name) is None for f in dataclasses.fields(cls)
           if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING):
        return  # a required field cannot be None
    ext = header.to_ext()
    assert all(isinstance(v, str) for v in ext.values())
    assert cls.from_ext(ext) == header


@pytest.mark.parametrize("cls", BODY_CLASSES, ids=lambda c: c.__name__)
@settings(derandomize=True)  # deterministic runs; widen max_examples locally to fuzz harder
@given(data=st.data())
def test_body_round_trip(cls: type, data: st.DataObject) -> None:
    body = data.draw(instances(cls))
    assert B.decode_body(cls, B.encode_body(body)) == body


@settings(derandomize=True)  # deterministic runs; widen max_examples locally to fuzz harder
@given(instances(H.SendMessageRequestHeader))
def test_send_header_v1_v2_conversion(header: H.SendMessageRequestHeader) -> None:
    v2 = header.to_v2_ext()
    assert set(v2) <= set("abcdefghijklmn")
    assert H.SendMessageRequestHeader.from_v2_ext(v2) == header
    assert H.to_v1_names(v2) == header.to_ext()
    for code, ext in ((RequestCode.SEND_MESSAGE, header.to_ext()), (RequestCode.SEND_MESSAGE_V2, v2),
                      (RequestCode.SEND_BATCH_MESSAGE, v2)):
        assert H.SendMessageRequestHeader.from_command(RemotingCommand.request(code, ext)) == header


def test_send_v2_as_ali_ons_sends_it() -> None:
    ext = {"a": "PG", "b": "T", "c": "TBW102", "d": "4", "e": "2", "f": "0", "g": "1700000000000", "h": "0",
           "i": "TAGS\x01TagA\x02", "j": "0", "k": "false", "l": "16", "m": "false",
           "AccessKey": "", "Signature": "x", "OnsChannel": "ALIYUN"}
    h = H.SendMessageRequestHeader.from_command(RemotingCommand.request(310, ext))
    assert (h.producer_group, h.topic, h.queue_id, h.born_timestamp, h.max_reconsume_times) == ("PG", "T", 2, 1700000000000, 16)
    assert h.unit_mode is False and h.batch is False and h.properties == "TAGS\x01TagA\x02"


def test_missing_and_bad_fields_are_named() -> None:
    with pytest.raises(InvalidParameterError, match=r"PullMessageRequestHeader\.queueOffset: the field is missing"):
        H.PullMessageRequestHeader.from_ext({"consumerGroup": "g", "topic": "t", "queueId": "0"})
    with pytest.raises(InvalidParameterError, match=r"QueryConsumerOffsetRequestHeader\.queueId: expected an integer, got '1x'"):
        H.QueryConsumerOffsetRequestHeader.from_ext({"consumerGroup": "g", "topic": "t", "queueId": "1x"})
    with pytest.raises(InvalidParameterError, match="does not fit a 64-bit integer"):
        H.GetMaxOffsetRequestHeader.from_ext({"topic": "t", "queueId": str(2**70)})


def test_defaults_and_java_booleans() -> None:
    h = H.ConsumerSendMsgBackRequestHeader.from_ext({"offset": "5", "group": "G", "delayLevel": "0", "unitMode": "TRUE"})
    assert h.unit_mode is True and h.origin_msg_id is None and h.max_reconsume_times is None
    assert "originMsgId" not in h.to_ext() and h.to_ext()["unitMode"] == "true"
    assert H.UnregisterClientRequestHeader(client_id="c").to_ext() == {"clientID": "c"}


def test_heartbeat_from_librocketmq_and_ali_ons() -> None:
    cpp = (b'{"clientID":"10.0.0.1@123","consumerDataSet":[{"consumeFromWhere":0,"consumeType":1,"groupName":"G",'
           b'"messageModel":1,"subscriptionDataSet":[{"classFilterMode":false,"codeSet":[0,0],"subString":"A||B",'
           b'"subVersion":"1700000000000","tagsSet":["A","B"],"topic":"T"}],"unitMode":false}],"producerDataSet":[]}')
    hb = B.decode_body(B.HeartbeatData, cpp)
    cd = hb.consumer_data_set[0]
    assert (cd.consume_type, cd.message_model, cd.consume_from_where) == (
        "CONSUME_PASSIVELY", "CLUSTERING", "CONSUME_FROM_LAST_OFFSET")
    sub = cd.subscription_data_set[0]
    assert sub.sub_version == 1700000000000 and sub.expression_type == "TAG" and sub.tags_set == ["A", "B"]
    ons = (b'{"clientID":"c","producerDataSet":[{"groupName":"P"}],"consumerDataSet":[{"groupName":"G",'
           b'"consumeType":"CONSUME_PASSIVELY","messageModel":"CLUSTERING","consumeFromWhere":"CONSUME_FROM_FIRST_OFFSET",'
           b'"unitMode":false,"subscriptionDataSet":[{"topic":"T","subString":"a > 5","classFilterMode":false,'
           b'"tagsSet":[],"codeSet":[],"subVersion":1700000000001,"expressionType":"SQL92"}]}]}')
    hb = B.decode_body(B.HeartbeatData, ons)
    assert hb.consumer_data_set[0].consume_from_where == "CONSUME_FROM_FIRST_OFFSET"
    assert hb.consumer_data_set[0].subscription_data_set[0].expression_type == "SQL92"
    assert hb.producer_data_set == [B.ProducerData(group_name="P")]


def test_bodies_errors_and_fastjson_integer_keys() -> None:
    route = B.decode_body(B.TopicRouteData, b'{"brokerDatas":[{"brokerAddrs":{0:"h:1",1:"h:2"},"brokerName":"b",'
                                            b'"cluster":"c"}],"queueDatas":[],"filterServerTable":{}}')
    assert route.broker_datas[0].broker_addrs == {0: "h:1", 1: "h:2"}
    assert route.broker_datas[0].select_broker_addr() == "h:1"
    assert b'"brokerAddrs":{"0":"h:1","1":"h:2"}' in B.encode_body(route)
    with pytest.raises(InvalidParameterError, match="not valid JSON"):
        B.decode_body(B.ConsumerListBody, b"{nope")
    with pytest.raises(InvalidParameterError, match=r"HeartbeatData\.clientID: the field is missing"):
        B.decode_body(B.HeartbeatData, b"{}")
    with pytest.raises(InvalidParameterError, match=r"consumerDataSet\[0\]\.groupName"):
        B.decode_body(B.HeartbeatData, b'{"clientID":"c","consumerDataSet":[{}]}')
    with pytest.raises(InvalidParameterError, match="no body"):
        B.decode_body(B.LockBatchRequestBody, b"")
    # Values decoded as they come (a str, an in-range int, a bool) and the rest still converted or refused.
    sub = b'{"clientID":"c","consumerDataSet":[{"groupName":"g","consumeType":0,"subscriptionDataSet":[%s]}]}'
    hb = B.decode_body(B.HeartbeatData, sub % b'{"topic":7,"subString":"*","subVersion":"12","tagsSet":["a",1]}')
    [sd] = hb.consumer_data_set[0].subscription_data_set
    assert (sd.topic, sd.sub_version, sd.tags_set) == ("7", 12, ["a", "1"])
    assert hb.consumer_data_set[0].consume_type == "CONSUME_ACTIVELY"  # an enum's ordinal, as fastjson may send
    with pytest.raises(InvalidParameterError, match=r"subVersion: 9223372036854775808 does not fit a 64-bit"):
        B.decode_body(B.HeartbeatData, sub % b'{"topic":"T","subVersion":9223372036854775808}')
    with pytest.raises(InvalidParameterError, match=r"subVersion: expected an integer, got True"):
        B.decode_body(B.HeartbeatData, sub % b'{"topic":"T","subVersion":true}')
    lock = B.LockBatchResponseBody(lock_ok_mq_set=[B.MessageQueue(topic="T", broker_name="b", queue_id=1)])
    assert B.encode_body(lock) == b'{"lockOKMQSet":[{"topic":"T","brokerName":"b","queueId":1}]}'
