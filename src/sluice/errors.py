"""One exception hierarchy for the whole package.

Every error carries the RocketMQ response code a server answers with when it
is raised while handling a request, so processors never map errors by hand.
"""
from __future__ import annotations

from sluice.protocol.codes import ResponseCode


class SluiceError(Exception):
    """Base of every error Sluice raises on purpose."""

    code: ResponseCode = ResponseCode.SYSTEM_ERROR

    def __init__(self, message: str = "", *, code: int | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = ResponseCode(code) if code in ResponseCode._value2member_map_ else code  # type: ignore[assignment]


class MessageIllegalError(SluiceError):
    """A message the store or broker refuses: bad topic, oversized body, bad property."""

    code = ResponseCode.MESSAGE_ILLEGAL


class InvalidParameterError(SluiceError):
    code = ResponseCode.INVALID_PARAMETER


class QueueIdIllegalError(SluiceError):
    """A send naming a queue id past the topic's queues: RocketMQ 4.x answers SYSTEM_ERROR (5.x
    INVALID_PARAMETER), and clients treat the reply as a failed send to retry elsewhere."""

    code = ResponseCode.SYSTEM_ERROR


class TopicNotExistError(SluiceError):
    code = ResponseCode.TOPIC_NOT_EXIST


class NoPermissionError(SluiceError):
    code = ResponseCode.NO_PERMISSION


class AclConfigError(InvalidParameterError):
    """A ``plain_acl.yml`` that cannot be used; the message names the file and the line or field."""


class ServiceNotAvailableError(SluiceError):
    code = ResponseCode.SERVICE_NOT_AVAILABLE


class StoreError(SluiceError):
    """The store cannot do what was asked (closed, disk trouble, ...)."""

    code = ResponseCode.SYSTEM_ERROR


class FlushDiskTimeoutError(StoreError):
    """A synchronous put's bytes did not become durable in time."""

    code = ResponseCode.FLUSH_DISK_TIMEOUT


class DiskFullError(ServiceNotAvailableError, StoreError):
    """The store refuses writes: its disk is above the used-space ratio or below the free-bytes floor, or
    space could not be allocated (ENOSPC). Answered as RocketMQ does, SERVICE_NOT_AVAILABLE; reads go on."""

    code = ResponseCode.SERVICE_NOT_AVAILABLE


class CorruptRecordError(StoreError):
    """A stored record failed its checks; it is reported, never served."""

    def __init__(self, message: str, *, path: str | None = None, offset: int | None = None) -> None:
        where = f" ({path} at file offset {offset})" if path is not None else ""
        super().__init__(message + where)
        self.path = path
        self.offset = offset


class FilterError(SluiceError):
    """Base of selector compile and evaluation errors."""

    code = ResponseCode.SUBSCRIPTION_PARSE_FAILED


class SelectorSyntaxError(FilterError):
    """A selector expression that does not parse or compile; `.position` is 0-based."""

    def __init__(
        self,
        message: str,
        *,
        position: int | None = None,
        expression: str | None = None,
        token: str | None = None,
    ) -> None:
        super().__init__(message)
        self.position = position
        self.expression = expression
        self.token = token


class FilterEvaluationError(FilterError):
    """A selector that compiled but could not be evaluated on one message (e.g. 'abc' > 5).

    RocketMQ logs these and treats the message as not matched; `matches()` does the same.
    """

    code = ResponseCode.SYSTEM_ERROR


class ProtocolError(SluiceError):
    """A frame or header that does not follow the remoting protocol."""

    code = ResponseCode.SYSTEM_ERROR


class RequestCodeNotSupportedError(ProtocolError):
    code = ResponseCode.REQUEST_CODE_NOT_SUPPORTED


class RemotingError(SluiceError):
    """A request could not be carried out over the network (connect, timeout, closed)."""

    code = ResponseCode.SYSTEM_ERROR


class RemotingTimeoutError(RemotingError):
    pass


class BrokerResponseError(SluiceError):
    """A server answered a request with an error code; `.code` is that code, the message its remark."""


class ClientError(SluiceError):
    """The SDK is used in a way it cannot honour: not started, shut down, a group registered twice,
    no route or broker for a topic."""

    code = ResponseCode.SYSTEM_ERROR


class RequestTimeoutError(ClientError):
    """``Producer.request`` got no reply within its timeout (RocketMQ's RequestTimeoutException, client error
    code REQUEST_TIMEOUT_EXCEPTION 10006); ``correlation_id`` names the request."""

    code = 10006  # type: ignore[assignment]  # ClientErrorCode.REQUEST_TIMEOUT_EXCEPTION: never a wire code

    def __init__(self, message: str = "", *, correlation_id: str = "") -> None:
        super().__init__(message)
        self.correlation_id = correlation_id


class TransactionStateError(SluiceError):
    """END_TRANSACTION that cannot apply to what it names: no half message at that commit-log offset, another
    producer group's, or a half-queue offset that is not the half's (EndTransactionProcessor's answers)."""

    code = ResponseCode.SYSTEM_ERROR


class NotFoundError(SluiceError):
    """What was looked up is not there: a message, a consumer group, a route (admin lookups).

    Never an empty answer in disguise: the admin tool exits with its own status for it."""

    code = ResponseCode.QUERY_NOT_FOUND


class BackfillRefusedError(InvalidParameterError):
    """A backfill hand-over the broker will not use: another selector than the group's live subscription,
    offsets or sizes that do not fit the consume queue, or over the broker's memory bound."""


class SelectorCompileBusyError(SluiceError):
    """A client starting more new subscription compilations than max_selector_compiles_per_client_per_minute
    allows: SYSTEM_BUSY, as RocketMQ answers a broker too busy to take the request (clients retry later)."""

    code = ResponseCode.SYSTEM_BUSY


class FilterClassError(FilterError):
    """A class filter (``MessageSelector.by_class``) that cannot be used: no filter server for a broker,
    registration refused (uploads off, class not found, import failure, conflict), or the class failing
    on a batch (raise, deadline, memory). ``.class_name`` and ``.cause`` say which class and why;
    ``.code`` is the code the filter server or broker answered with."""

    code = ResponseCode.SYSTEM_ERROR

    def __init__(self, message: str, *, class_name: str = "", cause: str = "", code: int | None = None) -> None:
        super().__init__(message, code=code)
        self.class_name = class_name
        self.cause = cause or message


# The filter server's answers (sluice/filtersrv/): one class per refusal, each with its code.

class FilterClassUploadRefusedError(FilterClassError):
    """A 302 carrying source while uploads are off (filter_class_uploads = false), or from an account the ACL
    does not let upload: NO_PERMISSION."""

    code = ResponseCode.NO_PERMISSION


class FilterClassNotFoundError(FilterClassError):
    """The class's module is not in the filter server's repository (nor uploaded): FILTER_DATA_NOT_EXIST."""

    code = ResponseCode.FILTER_DATA_NOT_EXIST


class FilterClassImportError(FilterClassError):
    """The class's module failed to load in its worker (syntax error, import error, not a MessageFilter,
    a raise or a limit while importing): SUBSCRIPTION_PARSE_FAILED, as a selector that does not compile."""

    code = ResponseCode.SUBSCRIPTION_PARSE_FAILED


class FilterClassConflictError(FilterClassError):
    """Another live member of the group registered a different class for the topic: SUBSCRIPTION_NOT_LATEST,
    the code of the broker's subscription conflicts (broker/sub_conflicts.py)."""

    code = ResponseCode.SUBSCRIPTION_NOT_LATEST


class FilterClassFailedError(FilterClassError):
    """The class failed on a pulled batch (raised, passed the deadline, hit its CPU or memory limit, its
    worker died): SYSTEM_ERROR, which clients answer by pulling the same offset again later."""

    code = ResponseCode.SYSTEM_ERROR


class MessageIdKindError(InvalidParameterError):
    """An id of the wrong kind for the lookup: a producer's msgId (UNIQ_KEY) where an offset msgId (store host,
    port, commit-log offset) belongs. Both are 32 hex characters for IPv4; ``kind`` says which one was given."""

    def __init__(self, message: str, *, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


class SubscriptionGroupNotExistError(SluiceError):
    """A consumer group the broker has no subscription group for, with auto-creation off."""

    code = ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
