"""Pull responses to PullResult: statuses, record decoding, the client-side tag re-check
(client/src/main/java/org/apache/rocketmq/client/impl/consumer/PullAPIWrapper.java)."""
from __future__ import annotations

import zlib

import pytest

from sluice import MessageSelector, PullStatus
from sluice.client.pull_consumer import process_pull_response
from sluice.errors import CorruptRecordError, FilterError, RemotingError
from sluice.filter import java_string_hash
from sluice.protocol import properties as P
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.protocol.command import RemotingCommand
from sluice.protocol.msgid import create_offset_msg_id
from sluice.protocol.record import FLAG_COMPRESSED, encode_record

HOST = ("127.0.0.1", 10911)


def record(offset: int, body: bytes = b"b", tags: str | None = None, *, sysflag: int = 0, **props: str) -> bytes:
    p = dict(props)
    if tags is not None:
        p["TAGS"] = tags
    p["UNIQ_KEY"] = f"{offset:032X}"
    return bytes(encode_record(topic="T", body=body, properties=P.encode_properties(p), queue_id=1,
                               queue_offset=offset, physical_offset=1000 + offset * 200, sysflag=sysflag,
                               store_host=HOST, born_host=("127.0.0.1", 5555)))


def response(code: int, body: bytes = b"", nxt: int = 5) -> RemotingCommand:
    req = RemotingCommand.request(RequestCode.PULL_MESSAGE)
    return req.make_response(code, None, {"suggestWhichBrokerId": 0, "nextBeginOffset": nxt, "minOffset": 0,
                                          "maxOffset": 9}, body)


def test_found_decodes_every_record_with_ids_and_offsets():
    body = record(0, b"zero", "A", a="1") + record(1, b"one", "B")
    r = process_pull_response(response(ResponseCode.SUCCESS, body), MessageSelector.by_tag("*"))
    assert r.status is PullStatus.FOUND and (r.next_begin_offset, r.min_offset, r.max_offset) == (5, 0, 9)
    m0, m1 = r.msg_found_list
    assert (m0.body, m0.tags, m0.user_properties, m0.queue_offset, m0.queue_id) == (b"zero", "A", {"a": "1"}, 0, 1)
    assert m0.msg_id == f"{0:032X}" and m0.offset_msg_id == create_offset_msg_id(*HOST, 1000)
    assert m1.properties["MIN_OFFSET"] == "0" and m1.properties["MAX_OFFSET"] == "9"


def test_tag_recheck_drops_hash_collisions_and_untagged():
    assert java_string_hash("Aa") == java_string_hash("BB")
    body = record(0, tags="Aa") + record(1, tags="BB") + record(2) + record(3, tags="Aa")
    r = process_pull_response(response(ResponseCode.SUCCESS, body), MessageSelector.by_tag("Aa || C"))
    assert r.status is PullStatus.FOUND and [m.queue_offset for m in r.msg_found_list] == [0, 3]


def test_found_with_everything_filtered_keeps_found_status():
    r = process_pull_response(response(ResponseCode.SUCCESS, record(0, tags="X")), MessageSelector.by_tag("Y"))
    assert r.status is PullStatus.FOUND and r.msg_found_list == [] and r.next_begin_offset == 5


def test_sql_results_are_not_rechecked():
    body = record(0, tags="X", a="1") + record(1)
    r = process_pull_response(response(ResponseCode.SUCCESS, body), MessageSelector.by_sql("a = 1"))
    assert len(r.msg_found_list) == 2  # the broker's decision stands, as in RocketMQ


def test_compressed_body_is_inflated():
    raw = b"hello " * 2000
    body = record(0, zlib.compress(raw, 5), sysflag=FLAG_COMPRESSED)
    (m,) = process_pull_response(response(ResponseCode.SUCCESS, body), MessageSelector.by_tag()).msg_found_list
    assert m.body == raw and m.sysflag & FLAG_COMPRESSED


@pytest.mark.parametrize(("code", "status"), [
    (ResponseCode.PULL_NOT_FOUND, PullStatus.NO_NEW_MSG),
    (ResponseCode.PULL_RETRY_IMMEDIATELY, PullStatus.NO_MATCHED_MSG),
    (ResponseCode.PULL_OFFSET_MOVED, PullStatus.OFFSET_ILLEGAL),
])
def test_other_statuses_carry_no_messages(code: int, status: PullStatus):
    r = process_pull_response(response(code, b"ignored", nxt=7), MessageSelector.by_tag())
    assert r.status is status and r.msg_found_list == [] and r.next_begin_offset == 7


def test_error_response_raises_its_class():
    req = RemotingCommand.request(RequestCode.PULL_MESSAGE)
    with pytest.raises(FilterError, match="bad sql"):
        process_pull_response(req.make_response(ResponseCode.SUBSCRIPTION_PARSE_FAILED, "bad sql"),
                              MessageSelector.by_tag())


def test_damaged_body_is_reported():
    body = bytearray(record(0, b"abc"))
    body[-20] ^= 0xFF
    with pytest.raises(CorruptRecordError):
        process_pull_response(response(ResponseCode.SUCCESS, bytes(body[:-3])), MessageSelector.by_tag())
    assert not issubclass(CorruptRecordError, RemotingError)



def test_a_missing_offset_is_the_header_error() -> None:
    missing = response(ResponseCode.PULL_NOT_FOUND, b"")
    missing.ext_fields.pop("maxOffset")
    with pytest.raises(Exception, match="maxOffset"):
        process_pull_response(missing, MessageSelector.by_tag())
    ok = response(ResponseCode.PULL_NOT_FOUND, b"")
    ok.ext_fields.update(dict(zip(("suggestWhichBrokerId", "nextBeginOffset", "minOffset", "maxOffset"),
                                  ["1", "12", "0", "40"])))
    r = process_pull_response(ok, MessageSelector.by_tag())
    assert (r.suggest_which_broker_id, r.next_begin_offset, r.min_offset, r.max_offset) == (1, 12, 0, 40)
