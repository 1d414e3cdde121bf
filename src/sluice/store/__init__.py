"""The broker's storage engine: commit log, consume queues, key index, dispatch, flush, recovery, retention.

Use the facade::

    with MessageStore(root, StoreConfig(flush_mode="sync")) as store:
        [res] = store.put_messages([StoreMessage("Orders", b"...", properties={"TAGS": "TagA"})])
        store.wait_dispatched()
        got = store.get_messages("Orders", 0, 0, 32)

Names are imported on first use (PEP 562): ``sluice.store.types`` alone does not load the engine.
"""
from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
        RequestDispatcher,
        StoreMessage,
        TagCodeFilter,
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
    "RequestDispatcher",
    "RetentionResult",
    "StoreConfig",
    "StoreMessage",
    "TagCodeFilter",
]

# public name -> the module that defines it
_HOME = {
    "StoreConfig": "config", "MessageStore": "message_store", "CheckReport": "recovery",
    "RecoveryReport": "recovery", "RetentionResult": "retention",
    **dict.fromkeys(("Dispatcher", "DispatchRequest", "GetMessageResult", "GetMessageStatus", "MessageFilter",
                     "Problem", "PutResult", "RequestDispatcher", "StoreMessage", "TagCodeFilter"), "types"),
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
