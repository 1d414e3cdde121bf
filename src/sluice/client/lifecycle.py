"""AsyncClient: what AsyncProducer, AsyncPullConsumer and AsyncPushConsumer share.

Each is a group on a namesrv set with keyword options; ``start`` joins the
loop's ClientInstance (MQClientInstance) and registers the group there,
``shutdown`` unregisters it and releases the instance, and ``async with``
does both. Only this plumbing lives here; each client's own start and
shutdown steps stay in its module.
"""
from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any, ClassVar, Literal, Self, TypeVar, cast

from sluice.client.instance import ClientConfig, ClientInstance, ConsumerInner
from sluice.client.options import split_options
from sluice.errors import ClientError, InvalidParameterError, SluiceError

__all__ = ["AsyncClient"]

O = TypeVar("O")

#: RocketMQ's Validators.checkGroup: the characters of topic names, at most 255 of them.
_GROUP_RE = re.compile(r"[%|a-zA-Z0-9_-]+")
_MAX_GROUP_LENGTH = 255


class AsyncClient(ABC):
    #: Registers as a producer group or a consumer group in the ClientInstance.
    _kind: ClassVar[Literal["producer", "consumer"]]
    #: How errors name this client ("producer", "pull consumer", ...).
    _role: ClassVar[str]

    group: str
    namesrv: str | list[str]
    client_config: ClientConfig
    _instance: ClientInstance | None

    def _setup(self, group: str, namesrv: str | Iterable[str], options_type: type[O],
               options: dict[str, Any]) -> O:
        """Check the group, keep the namesrv set, split the keyword options; returns the client's own options."""
        self._check_group(group)
        self.group = group
        self.namesrv = namesrv if isinstance(namesrv, str) else list(namesrv)
        own, self.client_config = split_options(options_type, options)
        self._instance = None
        return own

    def _check_group(self, group: str) -> None:
        """As RocketMQ's clients check it at start (Validators.checkGroup), but at construction: the group names
        broker-side state (and, for consumers, the %RETRY% topic), so a bad one would fail later and obscurely."""
        if not group:
            raise InvalidParameterError(f"a {self._kind} needs a group name")
        if not isinstance(group, str):
            raise InvalidParameterError(f"{self._kind} group must be a str, not {type(group).__name__}")
        if len(group) > _MAX_GROUP_LENGTH:
            raise InvalidParameterError(f"{self._kind} group {group[:40]!r}... is {len(group)} characters long; "
                                        f"the limit is {_MAX_GROUP_LENGTH}")
        if not _GROUP_RE.fullmatch(group):
            bad = next(c for c in group if not _GROUP_RE.fullmatch(c))
            raise InvalidParameterError(f"{self._kind} group {group!r} contains {bad!r}; "
                                        "allowed are A-Z a-z 0-9 _ % | -")

    def _check_not_started(self) -> None:
        if self._instance is not None:
            raise ClientError(f"{self._role} {self.group!r} is already started")

    async def _join(self) -> ClientInstance:
        """Acquire the instance and register this group in it (released again if that fails)."""
        self._check_not_started()
        inst = await ClientInstance.acquire(self.namesrv, self.client_config)
        try:
            if self._kind == "producer":
                inst.register_producer(self.group, self)
            else:
                inst.register_consumer(self.group, cast(ConsumerInner, self))
        except SluiceError:
            await inst.release()
            raise
        self._instance = inst
        return inst

    async def _leave(self, inst: ClientInstance) -> None:
        """Forget the instance, unregister the group from it (brokers are told) and release it."""
        self._instance = None
        if self._kind == "producer":
            await inst.unregister(producer_group=self.group)
        else:
            await inst.unregister(consumer_group=self.group)
        await inst.release()

    @property
    def instance(self) -> ClientInstance:
        if self._instance is None:
            raise ClientError(f"{self._role} {self.group!r} is not started")
        return self._instance

    @abstractmethod
    async def start(self) -> None:
        """Start the client (join the ClientInstance, begin its work)."""

    @abstractmethod
    async def shutdown(self) -> None:
        """Stop the client and leave the ClientInstance."""

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()
