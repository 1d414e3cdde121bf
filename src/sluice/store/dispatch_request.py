"""DispatchRequest: one appended record as dispatch and the dispatchers see it.

A leaf module: store/types.py (the Dispatcher contract) and store/dispatch_columns.py
(which builds requests from the appenders' columns) both import it, so neither imports the other.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DispatchRequest"]


@dataclass(slots=True)
class DispatchRequest:
    """One appended record as the dispatchers see it. A dispatcher may replace ``tag_code``
    (e.g. with a ConsumeQueueExt address) or fill ``bitmap``; the consume queue stores ``tag_code``."""

    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    size: int
    tag_code: int
    properties: dict[str, str]
    store_timestamp: int
    keys: list[str]
    uniq_key: str | None
    sysflag: int = 0
    bitmap: bytes | None = None
