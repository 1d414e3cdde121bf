"""One bad send fails alone: single sends to one queue that arrive together are appended in one store call
(appender.py); a send whose integer header does not fit its field must get MESSAGE_ILLEGAL naming the field,
and every other send of that append round, on other connections too, must still be stored.

Raw frames through the real RemotingClient against a real ``sluice broker`` subprocess."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from servers import running_cluster

from sluice.broker.appender import Appender, stored
from sluice.errors import MessageIllegalError
from sluice.protocol import headers as H
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.protocol.command import RemotingCommand
from sluice.store import MessageStore, StoreConfig, StoreMessage
from sluice.store.encode import encode_batch
from sluice.transport.client import RemotingClient

pytestmark = pytest.mark.integration

TOPIC = "TBW102"  # routed from the start; auto-creation makes the topic the sends name
GOOD_CONNS = 4
ROUNDS = 5

BAD = [  # (header field, value, the range the remark names)
    ("flag", 1 << 32, "-2147483648..2147483647"),
    ("flag", -(1 << 31) - 1, "-2147483648..2147483647"),
    ("sys_flag", 1 << 40, "-2147483648..2147483647"),
    ("queue_id", -(1 << 31) - 1, "-2147483648..2147483647"),
    ("reconsume_times", 1 << 33, "-2147483648..2147483647"),
    ("queue_id", 1 << 31, "-2147483648..2147483647"),
    ("max_reconsume_times", 1 << 31, "-2147483648..2147483647"),
]


def _send(topic: str, body: bytes, **fields: int) -> RemotingCommand:
    h = H.SendMessageRequestHeader(producer_group="PG", topic=topic, queue_id=fields.pop("queue_id", 0),
                                   born_timestamp=fields.pop("born_timestamp", int(time.time() * 1000)), **fields)
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, h.to_v2_ext(), body)


async def _rounds(addr: str, topic: str, field: str, value: int) -> list[tuple[list[RemotingCommand], RemotingCommand]]:
    clients = [RemotingClient() for _ in range(GOOD_CONNS + 1)]
    try:
        out = []
        for r in range(ROUNDS):
            goods = [c.invoke(addr, _send(topic, f"good {r}.{i}.{j}".encode()))
                     for i, c in enumerate(clients[:-1]) for j in range(3)]
            bad = clients[-1].invoke(addr, _send(topic, b"bad", **{field: value}))
            *replies, bad_reply = await asyncio.gather(*goods, bad)
            out.append((replies, bad_reply))
        return out
    finally:
        for c in clients:
            await c.close()


def test_an_integer_out_of_range_fails_only_its_own_send(tmp_path: Path) -> None:
    with running_cluster(tmp_path) as c:
        for n, (field, value, allowed) in enumerate(BAD):
            topic = f"Iso{n}"
            results = asyncio.run(_rounds(c.broker.addr, topic, field, value))
            for replies, bad in results:
                assert [r.code for r in replies] == [ResponseCode.SUCCESS] * len(replies), \
                    [(r.code, r.remark) for r in replies if r.code]
                assert bad.code == ResponseCode.MESSAGE_ILLEGAL, (field, bad.code, bad.remark)
                assert field.split("_")[0] in bad.remark.lower() and allowed in bad.remark, bad.remark
        # Beyond 64 bits the header itself does not decode (no Java long): INVALID_PARAMETER naming the field.
        results = asyncio.run(_rounds(c.broker.addr, "IsoLong", "born_timestamp", 1 << 64))
        for replies, bad in results:
            assert [r.code for r in replies] == [ResponseCode.SUCCESS] * len(replies)
            assert bad.code == ResponseCode.INVALID_PARAMETER and "bornTimestamp" in bad.remark \
                and "64-bit" in bad.remark, bad.remark
        log = (tmp_path / "broker-a.stderr.log").read_text()
        assert "Traceback" not in log
        assert "header field flag = 4294967296 is out of range" in log  # one line per refused send


ILLEGAL = [("flag", 1 << 32, "-2147483648..2147483647"), ("sysflag", -(1 << 31) - 1, "-2147483648..2147483647"),
           ("born_timestamp", 1 << 64, "-9223372036854775808..9223372036854775807"),
           ("reconsume_times", 1 << 31, "-2147483648..2147483647"),
           ("prepared_tx_offset", -(1 << 63) - 1, "-9223372036854775808..9223372036854775807")]


@pytest.mark.parametrize("field,value,allowed", ILLEGAL)
@pytest.mark.parametrize("c_encoder", [True, False])
def test_the_encoder_names_the_field_that_does_not_fit(monkeypatch: pytest.MonkeyPatch, field: str, value: int,
                                                      allowed: str, c_encoder: bool) -> None:
    if not c_encoder:
        monkeypatch.setattr("sluice.store.encode.C", None)
    good = StoreMessage("T", b"ok", 0, {}, born_host=("127.0.0.1", 1))
    bad = StoreMessage("T", b"bad", 0, {}, born_host=("127.0.0.1", 1), **{field: value})
    with pytest.raises(MessageIllegalError, match=f"{field} = {value} is out of range: it must be within {allowed}"):
        encode_batch([good, bad], store_host=("127.0.0.1", 10911), max_body=1024)


@pytest.mark.parametrize("flush", ["async", "sync"])
def test_a_message_the_encoder_refuses_fails_only_its_request(tmp_path: Path, flush: str) -> None:
    """Past the send path's header checks (retries, the schedule service, an embedding caller): the merged
    append round falls back to one call per request, whatever the error."""
    store = MessageStore(tmp_path, StoreConfig(flush_mode=flush, commitlog_file_size=1 << 20,  # type: ignore[arg-type]
                                               max_message_size=1024))
    store.start()
    appender = Appender(store)
    store.dispatch.drive_externally()

    async def main() -> None:
        goods = [[StoreMessage("T", f"m{i}".encode(), 0, {})] for i in range(4)]
        bad = [StoreMessage("T", b"bad", 0, {}, flag=1 << 32)]
        pending = [appender.put("T", 0, m) for m in goods[:2]] + [appender.put("T", 0, bad)] + \
                  [appender.put("T", 0, m) for m in goods[2:]]
        out = await asyncio.gather(*(stored(p) for p in pending), return_exceptions=True)
        assert isinstance(out[2], MessageIllegalError) and "flag = 4294967296" in str(out[2])
        assert [r[1][0].queue_offset for i, r in enumerate(out) if i != 2] == [0, 1, 2, 3]  # type: ignore[index]

        # Not a SluiceError either: still that request's alone.
        real = store.put_messages

        def put_messages(batch: list[StoreMessage], **kw: object) -> object:
            if any(m.body == b"boom" for m in batch):
                raise ValueError("boom")
            return real(batch, **kw)  # type: ignore[arg-type]

        store.put_messages = put_messages  # type: ignore[method-assign]
        pending = [appender.put("T", 0, m) for m in goods[:2]] + [appender.put("T", 0, [StoreMessage("T", b"boom")])]
        out = await asyncio.gather(*(stored(p) for p in pending), return_exceptions=True)
        assert isinstance(out[2], ValueError)
        assert [r[1][0].queue_offset for r in out[:2]] == [4, 5]  # type: ignore[index]

    try:
        asyncio.run(main())
    finally:
        appender.close()
        store.close()
