"""Topic configurations of one broker, persisted in {store}/config/topics.json.

Auto-creation follows RocketMQ: a producer sending to an unknown topic names a
default topic (``TBW102``); when the broker has auto-creation on, the new topic
takes the requested queue count (capped by the default topic's) and the default
topic's permissions.

Auto-created topics are capped (``max_auto_created_topics``): past the cap a send to an unknown topic
gets TOPIC_NOT_EXIST with RocketMQ's "topic[X] not exist, apply first please!" (its answer when
auto-creation is off, broker/.../processor/AbstractSendMessageProcessor.java msgCheck) plus the cap.
Which topics were auto-created is kept in topics.json (``autoCreated``, a Sluice key the namesrv never
sees); an admin update of such a topic adopts it, so it no longer counts.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from sluice.errors import InvalidParameterError, NoPermissionError, TopicNotExistError
from sluice.persist import JsonSaver, read_json
from sluice.protocol.bodies import PERM_INHERIT, PERM_READ, PERM_WRITE  # RocketMQ PermName bits: the wire format owns them
from sluice.protocol.record import check_topic

log = logging.getLogger(__name__)
#: At most one log line per this many seconds for sends refused by the auto-create cap.
_CAP_LOG_INTERVAL_S = 60.0

AUTO_CREATE_TOPIC = "TBW102"  # MixAll.AUTO_CREATE_TOPIC_KEY_TOPIC
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"


@dataclass(frozen=True, slots=True)
class TopicConfig:
    topic_name: str
    read_queue_nums: int = 4
    write_queue_nums: int = 4
    perm: int = PERM_READ | PERM_WRITE
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False

    def to_wire(self) -> dict:
        """The TopicConfig JSON shape RocketMQ's namesrv and admin tools read."""
        return {
            "topicName": self.topic_name,
            "readQueueNums": self.read_queue_nums,
            "writeQueueNums": self.write_queue_nums,
            "perm": self.perm,
            "topicFilterType": self.topic_filter_type,
            "topicSysFlag": self.topic_sys_flag,
            "order": self.order,
        }

    @property
    def readable(self) -> bool:
        return bool(self.perm & PERM_READ)

    @property
    def writable(self) -> bool:
        return bool(self.perm & PERM_WRITE)


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_PREFIX + group


class TopicConfigManager:
    """Thread-safe table of topic configs with a data version bumped on every change."""

    def __init__(self, config_dir: Path, *, auto_create: bool = True, default_queue_nums: int = 8,
                 max_auto_created: int = 1000, trace_topic: str | None = None) -> None:
        self._path = config_dir / "topics.json"
        self._lock = threading.RLock()
        self._topics: dict[str, TopicConfig] = {}
        self._saver = JsonSaver(self._path, self._document, self._lock, "topics-saver")
        self.auto_create = auto_create
        self.max_auto_created = max_auto_created
        self.auto_created: set[str] = set()  # topics created by sends, counted against the cap
        self.refused_by_cap = 0
        self._cap_logged_at = float("-inf")
        self.data_version = {"timestamp": int(time.time() * 1000), "counter": 0}
        self._load()
        # System topics RocketMQ brokers always have.
        self._ensure(TopicConfig(AUTO_CREATE_TOPIC, default_queue_nums, default_queue_nums,
                                 PERM_READ | PERM_WRITE | PERM_INHERIT if auto_create else PERM_READ | PERM_WRITE))
        self._ensure(TopicConfig(SCHEDULE_TOPIC, 18, 18, PERM_READ | PERM_WRITE))
        if trace_topic is not None:  # TopicConfigManager with traceTopicEnable: one read and one write queue
            self._ensure(TopicConfig(trace_topic, 1, 1, PERM_READ | PERM_WRITE))

    def _load(self) -> None:
        data = read_json(self._path, default={}) or {}
        for name, cfg in data.get("topicConfigTable", {}).items():
            self._topics[name] = TopicConfig(
                topic_name=name,
                read_queue_nums=int(cfg.get("readQueueNums", 4)),
                write_queue_nums=int(cfg.get("writeQueueNums", 4)),
                perm=int(cfg.get("perm", 6)),
                topic_filter_type=str(cfg.get("topicFilterType", "SINGLE_TAG")),
                topic_sys_flag=int(cfg.get("topicSysFlag", 0)),
                order=bool(cfg.get("order", False)),
            )
        self.auto_created = {n for n in data.get("autoCreated", ()) if n in self._topics}
        if "dataVersion" in data:
            self.data_version = dict(data["dataVersion"])

    def _persist(self, *, soon: bool = False) -> None:
        """Bump the data version and save: at once, or (``soon``) on the saver's thread, for what a client's
        send or heartbeat auto-creates (made again if a crash loses it; the caller is the event loop)."""
        self.data_version = {"timestamp": int(time.time() * 1000), "counter": self.data_version["counter"] + 1}
        if soon:
            self._saver.soon()
        else:
            self._saver.now()

    def _document(self) -> dict:
        with self._lock:
            return {**self.to_wire(), "autoCreated": sorted(self.auto_created)}

    def flush(self) -> None:
        """Write an auto-creation still waiting for the saver (broker stop)."""
        self._saver.flush()

    def _ensure(self, cfg: TopicConfig) -> None:
        with self._lock:
            if cfg.topic_name not in self._topics:
                self._topics[cfg.topic_name] = cfg
                self._persist()

    def to_wire(self) -> dict:
        """TopicConfigSerializeWrapper: what the broker registers with the namesrv."""
        with self._lock:
            return {
                "topicConfigTable": {n: c.to_wire() for n, c in self._topics.items()},
                "dataVersion": dict(self.data_version),
            }

    def get(self, topic: str) -> TopicConfig | None:
        return self._topics.get(topic)

    def all(self) -> list[TopicConfig]:
        with self._lock:
            return list(self._topics.values())

    def update(self, cfg: TopicConfig, *, by: str | None = None) -> TopicConfig:
        """Create or replace a topic (UPDATE_AND_CREATE_TOPIC); ``by`` names who asked, for the log."""
        check_topic(cfg.topic_name)
        if not (1 <= cfg.read_queue_nums <= 1024 and 1 <= cfg.write_queue_nums <= 1024):
            raise InvalidParameterError(
                f"queue numbers must be 1..1024, got read={cfg.read_queue_nums} write={cfg.write_queue_nums}")
        with self._lock:
            old = self._topics.get(cfg.topic_name)
            self._topics[cfg.topic_name] = cfg
            self.auto_created.discard(cfg.topic_name)  # adopted by an admin: no longer counted
            self._persist()
        if old is None:
            log.info("topic %s created%s: %s", cfg.topic_name, _by(by), _describe(cfg))
        elif old != cfg:
            log.info("topic %s updated%s: %s (was %s)", cfg.topic_name, _by(by), _describe(cfg), _describe(old))
        return cfg

    def delete(self, topic: str, *, by: str | None = None) -> bool:
        with self._lock:
            if self._topics.pop(topic, None) is None:
                return False
            self.auto_created.discard(topic)
            self._persist()
        log.info("topic %s deleted%s", topic, _by(by))
        return True

    def get_or_create_for_send(self, topic: str, default_topic: str | None, queue_nums: int,
                               *, by: str | None = None) -> TopicConfig:
        """The config a send goes to, creating it from the default topic when auto-creation allows; ``by``
        names the sender, for the log."""
        cfg = self._topics.get(topic)
        if cfg is not None:
            return cfg
        check_topic(topic)
        with self._lock:
            cfg = self._topics.get(topic)
            if cfg is not None:
                return cfg
            if topic.startswith(RETRY_PREFIX) or topic.startswith(DLQ_PREFIX):
                return self._create_system(topic, 1, by)
            default = self._topics.get(default_topic or AUTO_CREATE_TOPIC)
            if not self.auto_create or default is None or not default.perm & PERM_INHERIT:
                raise TopicNotExistError(
                    f"topic {topic!r} does not exist on this broker and auto-creation is "
                    f"{'off (set auto_create_topic = true)' if not self.auto_create else 'not allowed by the default topic'}; "
                    "create it with `sluice admin updateTopic`")
            if len(self.auto_created) >= self.max_auto_created:
                self.refused_by_cap += 1
                now = time.monotonic()
                if now - self._cap_logged_at >= _CAP_LOG_INTERVAL_S:
                    self._cap_logged_at = now
                    log.warning("send to unknown topic %r refused: %d topics auto-created, the cap "
                                "(max_auto_created_topics) is %d; %d refused so far", topic,
                                len(self.auto_created), self.max_auto_created, self.refused_by_cap)
                raise TopicNotExistError(
                    f"topic[{topic}] not exist, apply first please! (this broker has auto-created "
                    f"{len(self.auto_created)} topics, the cap max_auto_created_topics = {self.max_auto_created}; "
                    "create it with `sluice admin updateTopic`)")
            nums = max(1, min(queue_nums or default.write_queue_nums, default.write_queue_nums))
            cfg = TopicConfig(topic, nums, nums, default.perm & ~PERM_INHERIT)
            self._topics[topic] = cfg
            self.auto_created.add(topic)
            self._persist()
        log.info("topic %s auto-created on a send%s from %s: %s", topic, _by(by), default_topic or AUTO_CREATE_TOPIC,
                 _describe(cfg))
        return cfg

    def create_retry_or_dlq(self, topic: str, queue_nums: int = 1) -> TopicConfig:
        with self._lock:
            # A retry topic a heartbeat makes is saved off the caller's thread (the event loop): a crash that
            # loses it loses nothing else, since the group's next heartbeat makes it again. A DLQ, made when
            # a message moves there, is saved before the move goes on.
            return self._topics.get(topic) or self._create_system(topic, queue_nums,
                                                                  soon=topic.startswith(RETRY_PREFIX))

    def _create_system(self, topic: str, queue_nums: int, by: str | None = None, *, soon: bool = False
                       ) -> TopicConfig:
        cfg = TopicConfig(topic, queue_nums, queue_nums, PERM_READ | PERM_WRITE)
        self._topics[topic] = cfg
        self._persist(soon=soon)
        log.info("topic %s auto-created%s: %s", topic, _by(by), _describe(cfg))
        return cfg

    def check_writable(self, cfg: TopicConfig) -> None:
        if not cfg.writable:
            raise NoPermissionError(f"topic {cfg.topic_name!r} is not writable (perm={cfg.perm})")

    def check_readable(self, cfg: TopicConfig) -> None:
        if not cfg.readable:
            raise NoPermissionError(f"topic {cfg.topic_name!r} is not readable (perm={cfg.perm})")


def _by(who: str | None) -> str:
    return f" by {who}" if who else ""


def _describe(cfg: TopicConfig) -> str:
    return (f"{cfg.write_queue_nums} write / {cfg.read_queue_nums} read queues, perm {cfg.perm}"
            + (", order" if cfg.order else ""))


__all__ = ["TopicConfig", "TopicConfigManager", "retry_topic", "dlq_topic"]
