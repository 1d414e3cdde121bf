"""The class a class-filter subscription names (``MessageSelector.by_class("module:ClassName")``).

A filter class subclasses :class:`MessageFilter` and answers ``match(message)``
for each message a filter server pulls for the subscribing group (RocketMQ's
``org.apache.rocketmq.common.filter.MessageFilter``,
common/src/main/java/org/apache/rocketmq/common/filter/MessageFilter.java)::

    from sluice.filter import MessageFilter

    class BigOrders(MessageFilter):
        def match(self, message) -> bool:
            return message.tags == "order" and int(message.properties.get("amount", "0")) > 1000

The class never runs in a broker nor in a filter server: a filter server runs
it in a worker subprocess under resource limits (sluice/filtersrv/worker.py),
handing it messages only: each is a ``sluice.message.MessageExt`` (topic, tags,
keys, properties, user_properties, body, msg_id, offset_msg_id, queue_id,
queue_offset, ...), in fact a lazy view of the pulled record
(sluice/filtersrv/view.py) that decodes a field when it is read; fields other
than ``properties`` are read-only.
The class is built once per worker with no arguments.
"""
from __future__ import annotations

import abc
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sluice.message import MessageExt

__all__ = ["MessageFilter", "parse_class_name"]


class MessageFilter(abc.ABC):
    """Subclass and implement :meth:`match`; a filter server keeps the messages it answers True for."""

    @abc.abstractmethod
    def match(self, message: MessageExt) -> bool:
        """True to deliver ``message`` to the subscribing group, False to skip it."""


def parse_class_name(class_name: str) -> tuple[str, str]:
    """``"module:ClassName"`` (module dotted, ClassName an identifier) -> (module, ClassName); ValueError
    naming what is wrong otherwise."""
    module, sep, name = (class_name or "").partition(":")
    if not sep or not name.isidentifier() or not module or \
            not all(part.isidentifier() for part in module.split(".")):
        raise ValueError(f"a filter class is named 'module:ClassName' (module dotted, ClassName an identifier), "
                         f"not {class_name!r}")
    return module, name
