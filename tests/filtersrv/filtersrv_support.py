"""Helpers for the filter-server tests: a repository of filter classes, `sluice filtersrv` subprocesses,
and raw requests (sends to the broker, 302 and class-filter pulls to a filter server) through the real
RemotingClient. Kept out of conftest.py so the test modules import them by a unique name."""
from __future__ import annotations

import time
import zlib
from pathlib import Path
from typing import Any

from servers import SluiceProcess, wait_for

from sluice.acl.signature import Credentials, sign_fields
from sluice.client.broker_api import decode_messages
from sluice.message import MessageExt
from sluice.namesrv.client import SyncNamesrvClient
from sluice.protocol import headers as H
from sluice.protocol import properties as P
from sluice.protocol.batch import encode_batch
from sluice.protocol.codes import RequestCode, ResponseCode
from sluice.protocol.command import RemotingCommand
from sluice.transport.blocking import SyncRemotingClient

FLAG_COMMIT_OFFSET, FLAG_SUSPEND, FLAG_SUBSCRIPTION, FLAG_CLASS_FILTER = 0x1, 0x2, 0x4, 0x8

#: Filter classes the tests use, by module name (written into a repository directory).
CLASSES = {
    "evens": '''
from sluice.filter import MessageFilter

class Even(MessageFilter):
    def match(self, message):
        return int(message.properties["n"]) % 2 == 0
''',
    "tagged": '''
from sluice.filter import MessageFilter

class RedOnly(MessageFilter):
    def match(self, message):
        return message.tags == "red"
''',
    "nothing": '''
from sluice.filter import MessageFilter

class Nothing(MessageFilter):
    def match(self, message):
        return False
''',
    "broken_import": '''
import a_module_that_does_not_exist
''',
    "raises": '''
from sluice.filter import MessageFilter

class Boom(MessageFilter):
    def match(self, message):
        raise RuntimeError("boom at n=" + message.properties["n"])
''',
    "hangs": '''
import time
from sluice.filter import MessageFilter

class Sleeper(MessageFilter):
    def match(self, message):
        time.sleep(3600)
''',
    "spins": '''
from sluice.filter import MessageFilter

class Spinner(MessageFilter):
    def match(self, message):
        while True:
            pass
''',
    "hog": '''
from sluice.filter import MessageFilter

class Hog(MessageFilter):
    def match(self, message):
        self.keep = bytearray(4 * 1024 * 1024 * 1024)
        return True
''',
    "not_a_filter": '''
class Plain:
    def match(self, message):
        return True
''',
}


def write_repository(root: Path, classes: dict[str, str] | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for module, source in (classes or CLASSES).items():
        (root / f"{module}.py").write_text(source)
    return root


def start_filtersrv(tmp: Path, broker: str, *args: str, name: str = "filtersrv") -> SluiceProcess:
    return SluiceProcess.start(["filtersrv", "--broker", broker, "--register-interval", "0.5", *args], tmp,
                               name=name)


def crc(source: bytes) -> int:
    return zlib.crc32(source) & 0xFFFFFFFF


class FsRpc:
    """Raw requests: sends to the broker, registrations and pulls to filter servers."""

    def __init__(self, broker: str, credentials: Credentials | None = None) -> None:
        self.broker = broker
        self.client = SyncRemotingClient()
        self.credentials = credentials  # every request signed with it (ACL)

    def close(self) -> None:
        self.client.close()

    def call(self, addr: str, code: int, fields: dict[str, Any] | None = None, body: bytes = b"",
             timeout: float = 10.0) -> RemotingCommand:
        fields = {k: str(v) for k, v in (fields or {}).items()}
        if self.credentials is not None:
            sign_fields(self.credentials, fields, body)
        return self.client.invoke(addr, RemotingCommand.request(code, fields, body), timeout)

    def send(self, topic: str, n: int, *, tags: str | None = None, queue_id: int = 0) -> None:
        props = {"n": str(n)}
        if tags:
            props[P.TAGS] = tags
        h = H.SendMessageRequestHeader(producer_group="PG", topic=topic, queue_id=queue_id,
                                       properties=P.encode_properties(props), born_timestamp=int(time.time() * 1000))
        resp = self.call(self.broker, RequestCode.SEND_MESSAGE_V2, h.to_v2_ext(), f"m{n}".encode())
        assert resp.code == ResponseCode.SUCCESS, resp.remark

    def send_many(self, topic: str, numbers: range, *, tags: str | None = None, queue_id: int = 0) -> None:
        """SEND_BATCH_MESSAGE in batches of 500."""
        for start in range(0, len(numbers), 500):
            entries = []
            for n in numbers[start:start + 500]:
                props = {"n": str(n), **({P.TAGS: tags} if tags else {})}
                entries.append((f"m{n}".encode(), props, 0))
            h = H.SendMessageRequestHeader(producer_group="PG", topic=topic, queue_id=queue_id, batch=True)
            resp = self.call(self.broker, RequestCode.SEND_BATCH_MESSAGE, h.to_v2_ext(), encode_batch(entries))
            assert resp.code == ResponseCode.SUCCESS, resp.remark

    def register(self, fs: str, group: str, topic: str, class_name: str, source: bytes = b"",
                 class_crc: int | None = None, timeout: float = 20.0) -> RemotingCommand:
        fields = {"consumerGroup": group, "topic": topic, "className": class_name,
                  "classCRC": str(crc(source) if class_crc is None and source else class_crc or 0)}
        return self.call(fs, RequestCode.REGISTER_MESSAGE_FILTER_CLASS, fields, source, timeout)

    def pull(self, addr: str, group: str, topic: str, offset: int = 0, *, queue_id: int = 0, max_msgs: int = 32,
             flags: int = FLAG_CLASS_FILTER, commit_offset: int = 0, suspend_ms: int = 0,
             timeout: float = 20.0) -> RemotingCommand:
        h = H.PullMessageRequestHeader(consumer_group=group, topic=topic, queue_id=queue_id, queue_offset=offset,
                                       max_msg_nums=max_msgs, sys_flag=flags, commit_offset=commit_offset,
                                       suspend_timeout_millis=suspend_ms, subscription="*", sub_version=0,
                                       expression_type="TAG")
        return self.call(addr, RequestCode.PULL_MESSAGE, h.to_ext(), timeout=timeout)

    def committed(self, group: str, topic: str, queue_id: int = 0) -> int:
        h = H.QueryConsumerOffsetRequestHeader(consumer_group=group, topic=topic, queue_id=queue_id)
        resp = self.call(self.broker, RequestCode.QUERY_CONSUMER_OFFSET, h.to_ext())
        return int(resp.ext_fields["offset"]) if resp.code == ResponseCode.SUCCESS else -1

    def drain(self, fs: str, group: str, topic: str, *, queue_id: int = 0, limit: int = 50) -> list[MessageExt]:
        """Pull the queue through the filter server from 0 to its end (bounded), every kept message."""
        out: list[MessageExt] = []
        offset = 0
        for _ in range(limit):
            resp = self.pull(fs, group, topic, offset, queue_id=queue_id)
            if resp.code == ResponseCode.SUCCESS:
                out += decode_messages(resp.body)
            elif resp.code not in (ResponseCode.PULL_RETRY_IMMEDIATELY, ResponseCode.PULL_NOT_FOUND):
                raise AssertionError(f"pull answered {resp.code}: {resp.remark}")
            nxt = int(resp.ext_fields["nextBeginOffset"])
            if resp.code == ResponseCode.PULL_NOT_FOUND:
                return out
            offset = nxt
        raise AssertionError("the queue did not end within the pull limit")


def numbers(msgs: list[MessageExt]) -> list[int]:
    return [int(m.properties["n"]) for m in msgs]


def route_filter_servers(namesrv: str, topic: str, broker: str) -> list[str]:
    with SyncNamesrvClient(namesrv) as ns:
        return list(ns.get_route(topic).filter_server_table.get(broker) or ())


def wait_listed(namesrv: str, topic: str, broker: str, fs: str, timeout: float = 20.0) -> list[str]:
    return wait_for(lambda: fs in (lst := route_filter_servers(namesrv, topic, broker)) and lst, timeout,
                    f"filter server {fs} in the route of {topic}")
