"""SendFuture: the ``concurrent.futures.Future`` the blocking Producer's ``send_async`` returns, lighter per send.

A plain Future builds a ``threading.Condition`` (pure Python, over a new RLock) when made, and each of its
methods enters that Condition (a Python ``__enter__`` / ``__exit__`` pair) and ends with ``notify_all`` (Python
again) even when nobody waits. One send crosses five of them (add_done_callback, cancelled,
set_running_or_notify_cancel, set_result and the caller's result or exception). SendFuture keeps the same
states, results, callbacks, errors and waiter protocol, but its methods take the C RLock directly, and the
Condition over that same lock is made only when a thread first waits (``result`` / ``exception`` with the
future pending) or ``concurrent.futures.wait`` / ``as_completed`` asks for it; notifying is skipped while it
does not exist. Made under the lock, so it is never made twice; a waiter registers under the lock, so no
notification is missed. It is a ``concurrent.futures.Future`` (isinstance holds), as docs/sdk.md promises.
"""
from __future__ import annotations

import threading
from _thread import RLock as _RLock  # the C lock itself: threading.RLock, the factory, is a Python call
from concurrent.futures import CancelledError, Future, InvalidStateError
from concurrent.futures._base import (  # the states Future itself uses (CPython's names since 3.2)
    CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED, LOGGER, PENDING, RUNNING,
)
from typing import Any, TypeVar

__all__ = ["SendFuture"]

T = TypeVar("T")
_Condition = threading.Condition
_CANCELLED = (CANCELLED, CANCELLED_AND_NOTIFIED)
_DONE = (CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED)


class SendFuture(Future[T]):
    """A ``concurrent.futures.Future`` whose methods take its RLock directly and whose Condition is made on the
    first wait (the module doc); otherwise the same object, method for method."""

    def __init__(self) -> None:  # noqa: D107 - Future.__init__ without the Condition
        self._flock = _RLock()
        self._cond: threading.Condition | None = None
        self._state = PENDING
        self._result: Any = None
        self._exception: BaseException | None = None
        self._waiters: list[Any] = []
        self._done_callbacks: list[Any] = []

    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        """The Condition over this future's lock, made on first use (a waiter, wait(), as_completed(), repr)."""
        cond = self._cond
        if cond is None:
            with self._flock:
                cond = self._cond
                if cond is None:
                    cond = self._cond = _Condition(self._flock)  # type: ignore[arg-type]
        return cond

    def cancel(self) -> bool:
        with self._flock:
            state = self._state
            if state == RUNNING or state == FINISHED:
                return False
            if state in _CANCELLED:
                return True
            self._state = CANCELLED
            if self._cond is not None:  # made under this lock, by a thread that then waits on it
                self._cond.notify_all()
        self._invoke_callbacks()
        return True

    def cancelled(self) -> bool:
        with self._flock:
            return self._state in _CANCELLED

    def running(self) -> bool:
        with self._flock:
            return self._state == RUNNING

    def done(self) -> bool:
        with self._flock:
            return self._state in _DONE

    def add_done_callback(self, fn: Any) -> None:
        with self._flock:
            if self._state not in _DONE:
                self._done_callbacks.append(fn)
                return
        try:
            fn(self)
        except Exception:
            LOGGER.exception('exception calling callback for %r', self)

    def result(self, timeout: float | None = None) -> T:
        try:
            with self._flock:
                state = self._state
                if state in _CANCELLED:
                    raise CancelledError()
                if state == FINISHED:
                    return self._get_result()
                self._condition.wait(timeout)
                state = self._state
                if state in _CANCELLED:
                    raise CancelledError()
                if state == FINISHED:
                    return self._get_result()
                raise TimeoutError()
        finally:
            self = None  # type: ignore[assignment]  # as Future.result: no cycle through a raised exception

    def _get_result(self) -> T:
        exc = self._exception
        if exc:
            try:
                raise exc
            finally:
                self = None  # type: ignore[assignment]
                exc = None
        return self._result  # type: ignore[no-any-return]

    def exception(self, timeout: float | None = None) -> BaseException | None:
        with self._flock:
            state = self._state
            if state in _CANCELLED:
                raise CancelledError()
            if state == FINISHED:
                return self._exception
            self._condition.wait(timeout)
            state = self._state
            if state in _CANCELLED:
                raise CancelledError()
            if state == FINISHED:
                return self._exception
            raise TimeoutError()

    def set_running_or_notify_cancel(self) -> bool:
        with self._flock:
            state = self._state
            if state == CANCELLED:
                self._state = CANCELLED_AND_NOTIFIED
                for waiter in self._waiters:
                    waiter.add_cancelled(self)
                return False
            if state == PENDING:
                self._state = RUNNING
                return True
            LOGGER.critical('Future %s in unexpected state: %s', id(self), state)
            raise RuntimeError('Future in unexpected state')

    def set_result(self, result: T) -> None:
        with self._flock:
            if self._state in _DONE:
                raise InvalidStateError('{}: {!r}'.format(self._state, self))
            self._result = result
            self._state = FINISHED
            for waiter in self._waiters:
                waiter.add_result(self)
            if self._cond is not None:  # made under this lock, by a thread that then waits on it
                self._cond.notify_all()
        self._invoke_callbacks()

    def set_exception(self, exception: BaseException | None) -> None:
        with self._flock:
            if self._state in _DONE:
                raise InvalidStateError('{}: {!r}'.format(self._state, self))
            self._exception = exception
            self._state = FINISHED
            for waiter in self._waiters:
                waiter.add_exception(self)
            if self._cond is not None:  # made under this lock, by a thread that then waits on it
                self._cond.notify_all()
        self._invoke_callbacks()
