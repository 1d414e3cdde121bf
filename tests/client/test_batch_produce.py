"""send_batch of the common workload's messages from several threads against a real namesrv + broker: every
message arrives once with its id, tags and properties, and SQL92 filters see them (the C batch encoder when the
extension is built, its Python twin under SLUICE_NO_EXTENSIONS=1)."""
from __future__ import annotations

import threading
import time

import pytest
from sdk_support import Cluster, cluster, needs_broker, topic  # noqa: F401 (fixtures)

from sluice import Message, MessageExt, MessageSelector, Producer, PullConsumer, PullStatus, SendStatus
from sluice.errors import MessageIllegalError

pytestmark = [pytest.mark.integration, needs_broker]

REGIONS = ("eu", "us", "ap", "sa", "af", "me", "oc", "na", "ca", "in")


def _batch(topic: str, first: int) -> list[Message]:
    return [Message(topic, f"m{i}".encode() * 20, tags=f"Tag{'ABCDEFGHIJ'[i % 10]}", keys=f"k{i}",
                    properties={"region": REGIONS[i % 10], "a": str(i % 100), "ü": "ß"})
            for i in range(first, first + 32)]


def _pull(c: PullConsumer, topic: str, selector: MessageSelector, expect: int) -> list[MessageExt]:
    deadline = time.monotonic() + 20
    while True:
        out: list[MessageExt] = []
        for q in c.fetch_message_queues(topic):
            offset = 0
            while True:
                r = c.pull(q, selector, offset, 64)
                out += r.msg_found_list
                if r.status is not PullStatus.FOUND and r.next_begin_offset == offset:
                    break
                if r.status in (PullStatus.NO_NEW_MSG, PullStatus.OFFSET_ILLEGAL):
                    break
                offset = r.next_begin_offset
        if len(out) >= expect or time.monotonic() > deadline:
            return out
        time.sleep(0.1)


def test_batches_from_threads_arrive_whole_and_filter(cluster: Cluster, topic: str):
    sent: dict[str, Message] = {}
    errors: list[BaseException] = []
    lock = threading.Lock()
    with Producer("PG_batch_threads", cluster.ns) as p:
        def work(k: int) -> None:
            try:
                for first in range(k * 128, (k + 1) * 128, 32):
                    batch = _batch(topic, first)
                    r = p.send_batch(batch)
                    assert r.status is SendStatus.SEND_OK and len(r.msg_ids) == 32
                    with lock:
                        sent.update(zip(r.msg_ids, batch))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        with pytest.raises(MessageIllegalError, match="reserved"):
            p.send_batch([*_batch(topic, 0)[:2], Message(topic, b"x", properties={"UNIQ_KEY": "mine"})])
    assert len(sent) == 512
    with PullConsumer("CG_batch_threads", cluster.ns) as c:
        got = _pull(c, topic, MessageSelector.by_tag("*"), 512)
        assert len(got) == 512 and {m.msg_id for m in got} == set(sent)
        for m in got:
            s = sent[m.msg_id]
            assert (m.body, m.tags, m.keys, m.user_properties) == (s.body, s.tags, s.key_list(), s.properties)
        want = {i for i in range(512) if i % 10 == 0 and i % 100 >= 50}
        eu = _pull(c, topic, MessageSelector.by_sql("region = 'eu' AND a >= 50"), len(want))
        assert sorted(int(m.body[1:m.body.index(b"m", 1)]) for m in eu) == sorted(want)
