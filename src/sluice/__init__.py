"""Sluice: a RocketMQ 4.x compatible message queue in Python, built around server-side filtering.

The package face is lazy (PEP 562): ``from sluice import Producer`` loads the SDK and
what it needs, never the store, the broker or the name server; ``import sluice.protocol``
loads only the codec. Each name below is imported on first use.
"""
from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sluice.client import (
        ALLOCATE_STRATEGIES, AsyncProducer, AsyncPullConsumer, AsyncPushConsumer, ConsumeFromWhere,
        ConsumeOrderlyResult, ConsumeResult, MessageModel, MessageQueue, MessageSelector, Producer, PullConsumer,
        PullResult, PullStatus, PushConsumer, SendResult, SendStatus, select_by_hash,
    )
    from sluice.client import AsyncTransactionProducer, LocalTransactionState, TransactionProducer
    from sluice.client import AsyncLitePullConsumer, LitePullConsumer, reply_to
    from sluice.acl.signature import Credentials
    from sluice.errors import SluiceError
    from sluice.message import Message, MessageExt

__version__ = "0.1.0"
__all__ = [
    "ALLOCATE_STRATEGIES", "AsyncPushConsumer", "ConsumeFromWhere", "ConsumeOrderlyResult", "ConsumeResult",
    "Credentials", "MessageModel", "PushConsumer",
    "AsyncProducer", "AsyncPullConsumer", "Message", "MessageExt", "MessageQueue", "MessageSelector", "Producer",
    "PullConsumer", "PullResult", "PullStatus", "SendResult", "SendStatus", "SluiceError", "__version__",
    "select_by_hash", "AsyncTransactionProducer", "LocalTransactionState", "TransactionProducer", "reply_to",
    "AsyncLitePullConsumer", "LitePullConsumer",
]

# name -> the module that defines it (the client's names go through sluice.client's own lazy face).
_HOME = {name: "sluice.client" for name in __all__}
_HOME.update(Credentials="sluice.acl.signature", SluiceError="sluice.errors", Message="sluice.message",
             MessageExt="sluice.message")
del _HOME["__version__"]

# `import sluice; sluice.filter.compile_selector(...)` worked while the face imported eagerly: keep it.
_SUBMODULES = frozenset({
    "acl", "admin", "broker", "cli", "client", "demo", "embedded", "errors", "filter", "format", "message",
    "namesrv", "persist", "protocol", "spark", "speedups", "store", "transport",
})


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is not None:
        value = getattr(import_module(home), name)
    elif name in _SUBMODULES:
        value = import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
