"""The messages users hand to a producer (`Message`) and get from a consumer (`MessageExt`)."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from sluice.errors import MessageIllegalError
from sluice.protocol import properties as P
from sluice.protocol.msgid import create_offset_msg_id
from sluice.protocol.record import RecordView, check_topic, decompress_body


@dataclass(slots=True)
class Message:
    """A message to send: ``Message("Orders", b"...", tags="TagA", keys=["k1"], properties={"a": "1"})``."""

    topic: str
    body: bytes
    tags: str | None = None
    keys: Iterable[str] | str | None = None
    properties: dict[str, str] = field(default_factory=dict)
    flag: int = 0
    delay_level: int = 0
    #: Deliver at this time (epoch milliseconds, the broker's clock; 1 s precision). Beyond RocketMQ 4.x.
    deliver_at: int | None = None
    #: Deliver this many seconds after the broker receives the message (millisecond resolution).
    delay: float | None = None

    def validate(self, max_body: int = 4 * 1024 * 1024) -> None:
        check_topic(self.topic)
        if not isinstance(self.body, (bytes, bytearray, memoryview)):
            raise MessageIllegalError(f"message body must be bytes, not {type(self.body).__name__}")
        if len(self.body) == 0:
            raise MessageIllegalError("message body is empty")
        if len(self.body) > max_body:
            raise MessageIllegalError(f"message body is {len(self.body)} bytes; the limit is {max_body}")
        if not isinstance(self.flag, int) or not -2**31 <= self.flag < 2**31:
            # the wire and the record keep FLAG as a Java int
            raise MessageIllegalError(f"flag must be an int that fits 32 bits (Java int), got {self.flag!r}")
        for name, value in self.properties.items():
            if name in P.SYSTEM_NAMES:
                raise MessageIllegalError(f"property name {name!r} is reserved by the system")
            P.check_property(name, str(value))
        if self.tags is not None:
            P.check_property(P.TAGS, self.tags)
        for k in self.key_list():
            P.check_property(P.KEYS, k)
        timed = (self.deliver_at is not None) + (self.delay is not None) + (self.delay_level > 0)
        if timed > 1:
            raise MessageIllegalError("set only one of delay_level, deliver_at and delay")
        if self.deliver_at is not None and (not isinstance(self.deliver_at, int) or self.deliver_at < 0):
            raise MessageIllegalError(f"deliver_at must be epoch milliseconds (an int >= 0), got {self.deliver_at!r}")
        if self.delay is not None and not 0 <= self.delay < 2**53 / 1000:
            raise MessageIllegalError(f"delay must be a number of seconds >= 0, got {self.delay!r}")

    def key_list(self) -> list[str]:
        if self.keys is None:
            return []
        if isinstance(self.keys, str):
            return P.split_keys(self.keys)
        return [k for k in self.keys if k]

    def all_properties(self) -> dict[str, str]:
        """User properties plus TAGS, KEYS, DELAY and the TIMER_* deliver-at fields as they travel."""
        props = {k: str(v) for k, v in self.properties.items()}
        if self.tags:
            props[P.TAGS] = self.tags
        keys = self.key_list()
        if keys:
            props[P.KEYS] = P.KEY_SEPARATOR.join(keys)
        if self.delay_level > 0:
            props[P.DELAY] = str(self.delay_level)
        if self.deliver_at is not None:
            props[P.TIMER_DELIVER_MS] = str(int(self.deliver_at))
        if self.delay is not None:
            props[P.TIMER_DELAY_MS] = str(round(self.delay * 1000))
        return props


@dataclass(slots=True)
class MessageExt:
    """A stored message as a consumer sees it."""

    topic: str
    body: bytes
    properties: dict[str, str]
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    msg_id: str
    offset_msg_id: str
    sysflag: int
    flag: int
    born_timestamp: int
    born_host: tuple[str, int]
    store_timestamp: int
    store_host: tuple[str, int]
    reconsume_times: int
    body_crc: int
    store_size: int

    @property
    def tags(self) -> str | None:
        return self.properties.get(P.TAGS)

    @property
    def keys(self) -> list[str]:
        return P.split_keys(self.properties.get(P.KEYS))

    @property
    def user_properties(self) -> dict[str, str]:
        return {k: v for k, v in self.properties.items() if k not in P.SYSTEM_NAMES}

    @classmethod
    def from_record(cls, rec: RecordView) -> MessageExt:
        props = P.decode_properties(rec.properties)
        offset_id = create_offset_msg_id(rec.store_host[0], rec.store_host[1], rec.physical_offset)
        return cls(
            topic=rec.topic,
            body=decompress_body(rec),
            properties=props,
            queue_id=rec.queue_id,
            queue_offset=rec.queue_offset,
            commitlog_offset=rec.physical_offset,
            msg_id=props.get(P.UNIQ_KEY, offset_id),
            offset_msg_id=offset_id,
            sysflag=rec.sysflag,
            flag=rec.flag,
            born_timestamp=rec.born_timestamp,
            born_host=rec.born_host,
            store_timestamp=rec.store_timestamp,
            store_host=rec.store_host,
            reconsume_times=rec.reconsume_times,
            body_crc=rec.body_crc,
            store_size=rec.total_size,
        )


def properties_of(props: Mapping[str, str]) -> str:
    """Encode a full property mapping (system names included) for the wire or the store."""
    return P.encode_properties(props)
