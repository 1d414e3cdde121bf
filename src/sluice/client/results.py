"""What sends and pulls return: SendResult / SendStatus, PullResult / PullStatus, and MessageQueue.

``MessageQueue`` is the protocol's body type (topic, broker_name, queue_id),
reused so queues read from lock bodies and routes compare equal to these.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from sluice.message import MessageExt
from sluice.protocol.bodies import MessageQueue

__all__ = ["MessageQueue", "PullResult", "PullStatus", "SendResult", "SendStatus", "queue_sort_key"]


def queue_sort_key(mq: MessageQueue) -> tuple[str, str, int]:
    """RocketMQ's MessageQueue.compareTo order: topic, broker name, queue id."""
    return (mq.topic, mq.broker_name, mq.queue_id)


class SendStatus(Enum):
    """SendStatus.java: anything but SEND_OK means stored, but not as durably as asked."""

    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


@dataclass(frozen=True, slots=True)
class SendResult:
    """``msg_id`` is the client unique id (UNIQ_KEY); ``offset_msg_id`` the broker's id (host, port, offset).

    For a batch both are the per-message ids joined by commas, as RocketMQ's SendResult has them.
    """

    status: SendStatus
    msg_id: str
    offset_msg_id: str
    queue: MessageQueue
    queue_offset: int
    transaction_id: str | None = None

    @property
    def msg_ids(self) -> list[str]:
        return self.msg_id.split(",") if self.msg_id else []

    @property
    def offset_msg_ids(self) -> list[str]:
        return self.offset_msg_id.split(",") if self.offset_msg_id else []


class PullStatus(Enum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


@dataclass(slots=True)
class PullResult:
    """One pull: pull again from ``next_begin_offset``. ``msg_found_list`` is empty unless FOUND
    (and may be empty even then, when the client-side tag re-check removed every message)."""

    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    msg_found_list: list[MessageExt] = field(default_factory=list)
    suggest_which_broker_id: int = 0
