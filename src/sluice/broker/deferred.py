"""``Deferred``: what a plain request handler returns when it answers the request itself later.

A held pull (broker/pull.py) is answered by a callback of the hold service, not by a task: its handler returns
a Deferred, the gate (broker/gate.py) keeps the request counted in flight until the answer settles it. Awaiting
one gives None at once, so a handler registered without the gate still works (the connection answers
nothing: the handler's callback does).
"""
from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

__all__ = ["Deferred"]


class Deferred:
    __slots__ = ("on_settle", "settled", "exc")

    def __init__(self) -> None:
        #: Set by whoever counts the request (the gate); called once, with the refusal if the answer was one.
        self.on_settle: Callable[[BaseException | None], None] | None = None
        #: Settled already (maybe before the gate saw it: the gate then counts it done at once).
        self.settled = False
        self.exc: BaseException | None = None

    def settle(self, exc: BaseException | None = None) -> None:
        """The request is answered (or needs no answer any more); later calls do nothing."""
        if self.settled:
            return
        self.settled = True
        self.exc = exc
        cb = self.on_settle
        if cb is not None:
            self.on_settle = None
            cb(exc)

    def __await__(self) -> Generator[Any, None, None]:
        return iter(())  # type: ignore[return-value]
