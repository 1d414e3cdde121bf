"""Exit statuses of ``sluice admin`` and the one place exceptions are mapped to them.

Scripts branch on these, so they are part of the interface (docs/admin.md)::

    0 SUCCESS      1 ERROR        2 USAGE        3 NOT_FOUND
    4 UNAVAILABLE  5 REFUSED      6 PARTIAL      130 INTERRUPTED
"""
from __future__ import annotations

from enum import IntEnum

import click

from sluice import errors as E
from sluice.protocol.codes import ResponseCode

__all__ = ["ExitStatus", "exit_status_for"]


class ExitStatus(IntEnum):
    SUCCESS = 0
    #: Anything not named below: a broker's SYSTEM_ERROR, an unexpected failure.
    ERROR = 1
    #: The command line is wrong: unknown flag, missing option, malformed value (click's own code).
    USAGE = 2
    #: What was asked about is not there: topic, group, message, route, online consumers.
    NOT_FOUND = 3
    #: No namesrv or broker answered in time (refused connection, timeout, shutting down).
    UNAVAILABLE = 4
    #: A server (or the SDK before sending) refused the request as invalid or not permitted.
    REFUSED = 5
    #: Done on some brokers or messages and not on others; the output says which.
    PARTIAL = 6
    #: Ctrl-C.
    INTERRUPTED = 130


#: CONSUMER_NOT_ONLINE (206) is not in ResponseCode; the broker answers it for an unknown group.
CONSUMER_NOT_ONLINE = 206
_NOT_FOUND_CODES = frozenset({
    ResponseCode.QUERY_NOT_FOUND, ResponseCode.TOPIC_NOT_EXIST, ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
    ResponseCode.SUBSCRIPTION_NOT_EXIST, ResponseCode.NO_MESSAGE, CONSUMER_NOT_ONLINE,
})

# Most specific first: the first class that matches wins.
_BY_CLASS: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], ExitStatus], ...] = (
    ((KeyboardInterrupt, click.Abort), ExitStatus.INTERRUPTED),
    (click.UsageError, ExitStatus.USAGE),
    ((E.NotFoundError, E.TopicNotExistError), ExitStatus.NOT_FOUND),
    ((E.RemotingError, E.ServiceNotAvailableError), ExitStatus.UNAVAILABLE),
    ((E.InvalidParameterError, E.FilterError, E.MessageIllegalError, E.NoPermissionError), ExitStatus.REFUSED),
)


def exit_status_for(exc: BaseException) -> ExitStatus:
    """The exit status for an exception that ended a command."""
    for classes, status in _BY_CLASS:
        if isinstance(exc, classes):
            return status
    if isinstance(exc, E.SluiceError):
        # Errors decoded from responses keep the server's code: classify the codes that mean "not there".
        return ExitStatus.NOT_FOUND if exc.code in _NOT_FOUND_CODES else ExitStatus.ERROR
    if isinstance(exc, click.ClickException):
        return ExitStatus.ERROR
    return ExitStatus.ERROR
