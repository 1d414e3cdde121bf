"""The broker's storage engine: commit log, consume queues, key index, dispatch, flush, recovery, retention.

Use the facade::

    with MessageStore(root, StoreConfig(flush_mode="sync")) as store:
        [res] = store.put_messages([StoreMessage("Orders", b"...", properties={"TAGS": "TagA"})])
        store.wait_dispatched()
        got = store.get_messages("Orders", 0, 0, 32)
"""
from sluice.store.config import StoreConfig
from sluice.store.message_store import MessageStore
from sluice.store.recovery import CheckReport, RecoveryReport
from sluice.store.retention import RetentionResult
from sluice.store.types import (
    Dispatcher,
    DispatchRequest,
    GetMessageResult,
    GetMessageStatus,
    MessageFilter,
    Problem,
    PutResult,
    StoreMessage,
)

__all__ = [
    "CheckReport",
    "DispatchRequest",
    "Dispatcher",
    "GetMessageResult",
    "GetMessageStatus",
    "MessageFilter",
    "MessageStore",
    "Problem",
    "PutResult",
    "RecoveryReport",
    "RetentionResult",
    "StoreConfig",
    "StoreMessage",
]
