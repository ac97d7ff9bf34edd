"""The StoreError tree: every failure libstore raises.

Outcomes (a flush that timed out, an empty pull) are status values in results, not exceptions;
see :mod:`libstore.results`. Exceptions mean nothing was done (bad input) or the store stopped.
Each class has a ``reason``: the RocketMQ-style name the services put in ``google.rpc.ErrorInfo``.

::

    StoreError
    ├── ConfigError                      bad configuration, raised at start
    ├── MessageIllegalError              bad message; nothing of its batch was written
    │   ├── IllegalTopicError            empty, too long, or characters outside [A-Za-z0-9_%|-]
    │   ├── PropertiesSizeExceededError  serialized properties over 32767 bytes
    │   └── QueueIdOutOfRangeError       queue id outside the topic's queues
    ├── InvalidArgumentError             a malformed request parameter (message id, offset, count)
    │   └── InvalidReceiptHandleError    a pop receipt handle that is malformed, expired or superseded
    ├── TopicNotFoundError               unknown topic and auto-create is off
    ├── MessageNotFoundError             no message with the id asked for
    ├── OffsetOutOfRangeError            a physical range outside what the log holds
    ├── LogDivergedError                 a follower read bytes the log has since cut
    ├── CorruptRecordError               bytes that do not decode as a CommitLog record
    ├── StoreLockedError                 another process holds the store's lock file
    ├── RoleSwitchError                  a promotion or demotion that would break the group
    ├── ServiceNotAvailableError         store shut down or not writeable
    │   ├── NotMasterError               a put reached a SLAVE
    │   ├── OSPageCacheBusyError         the put lock has been held too long (page cache stall)
    │   └── TooManyRequestsError         a bound on concurrent work was reached
    │       └── SystemBusyError          the server cannot keep up; retry after ``retry_after_ms``
    └── StoreIOError                     an OSError in the store's files (fail-stop)
        └── DiskFullError                no space for a new file
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

T = TypeVar("T")


class StoreError(Exception):
    """Root of libstore's exceptions.

    :meth:`details` are string key/values that travel with the error across services (gRPC
    ErrorInfo metadata); :meth:`from_details` rebuilds the error from them.
    """

    reason = "STORE_ERROR"

    def details(self) -> dict[str, str]:
        return {}

    @classmethod
    def from_details(cls, message: str, details: dict[str, str]) -> StoreError:
        return cls(message)


class ConfigError(StoreError):
    """A configuration key or value is invalid."""

    reason = "CONFIG_ILLEGAL"


class MessageIllegalError(StoreError):
    """A message violates a store limit (RocketMQ MESSAGE_ILLEGAL). Nothing was written."""

    reason = "MESSAGE_ILLEGAL"


class IllegalTopicError(MessageIllegalError):
    """The topic name is empty, too long or holds characters outside ``[A-Za-z0-9_%|-]``."""

    reason = "TOPIC_ILLEGAL"


class PropertiesSizeExceededError(MessageIllegalError):
    """Serialized properties exceed 32767 bytes (RocketMQ PROPERTIES_SIZE_EXCEEDED)."""

    reason = "PROPERTIES_SIZE_EXCEEDED"


class QueueIdOutOfRangeError(MessageIllegalError):
    """The queue id is negative or not below the topic's write queue count."""

    reason = "QUEUE_ID_ILLEGAL"


class InvalidArgumentError(StoreError):
    """A request parameter is malformed (a message id that does not decode, a negative count...)."""

    reason = "INVALID_ARGUMENT"


class InvalidReceiptHandleError(InvalidArgumentError):
    """A pop receipt handle that does not decode, has expired, or was replaced by a later
    delivery or change of invisible time (RocketMQ INVALID_RECEIPT_HANDLE)."""

    reason = "INVALID_RECEIPT_HANDLE"


class AuthenticationError(StoreError):
    """The caller could not be identified: no credentials, a signature that does not verify,
    an unknown access key or a date outside the allowed clock skew (gRPC UNAUTHENTICATED).
    The message never tells an unknown key from a wrong signature."""

    reason = "UNAUTHENTICATED"


class PermissionDeniedError(StoreError):
    """The caller is known but lacks the permission for this resource or operation (RocketMQ
    NO_PERMISSION, gRPC PERMISSION_DENIED). Nothing was written."""

    reason = "NO_PERMISSION"


class TooManyTopicsError(InvalidArgumentError):
    """Creating the topic would pass ``maxTopicCount`` (nothing was created)."""

    reason = "TOO_MANY_TOPICS"


class TopicNotFoundError(StoreError):
    """The topic does not exist and auto-creation is disabled."""

    reason = "TOPIC_NOT_EXIST"


class MessageNotFoundError(StoreError):
    """No message matches the id or key asked for."""

    reason = "MESSAGE_NOT_FOUND"


class OffsetOutOfRangeError(StoreError):
    """A physical offset or range lies outside the log's readable bytes."""

    reason = "OFFSET_ILLEGAL"


class LogDivergedError(StoreError):
    """A follower of the CommitLog (dispatch, index) last read generation ``(log_id,
    generation)``, and the log has since been cut at ``consistent_offset``: the follower must
    drop what it derived from bytes at or past that offset, then follow generation
    ``generation`` of ``log_id`` (see libstore.log_generation)."""

    reason = "LOG_DIVERGED"

    def __init__(
        self, message: str, consistent_offset: int = 0, log_id: str = "", generation: int = 0
    ) -> None:
        super().__init__(message)
        self.consistent_offset = consistent_offset
        self.log_id = log_id
        self.generation = generation

    def details(self) -> dict[str, str]:
        return {
            "consistent_offset": str(self.consistent_offset),
            "log_id": self.log_id,
            "generation": str(self.generation),
        }

    @classmethod
    def from_details(cls, message: str, details: dict[str, str]) -> StoreError:
        try:
            return cls(
                message,
                int(details.get("consistent_offset", "0")),
                details.get("log_id", ""),
                int(details.get("generation", "0")),
            )
        except ValueError:
            return cls(message)


class CorruptRecordError(StoreError):
    """Bytes at an offset are not a valid CommitLog record."""

    reason = "CORRUPT_RECORD"


class StoreLockedError(StoreError):
    """Another process holds the store's ``lock`` file."""

    reason = "STORE_LOCKED"


class RoleSwitchError(StoreError):
    """A promotion or demotion was refused (the master still answers, the target is not a
    newer master, the broker groups differ...): nothing changed."""

    reason = "ROLE_SWITCH_REFUSED"


class ServiceNotAvailableError(StoreError):
    """The store cannot take the request now (shut down, not writeable, or a slave)."""

    reason = "SERVICE_NOT_AVAILABLE"


class NotMasterError(ServiceNotAvailableError):
    """The store is a SLAVE: it takes bytes from its master, not puts."""

    reason = "NOT_MASTER"


class OSPageCacheBusyError(ServiceNotAvailableError):
    """The put lock has been held longer than ``osPageCacheBusyTimeOutMills`` (OS_PAGE_CACHE_BUSY)."""

    reason = "OS_PAGE_CACHE_BUSY"


class TooManyRequestsError(ServiceNotAvailableError):
    """A bound on concurrent work was reached (held long polls, open streams): the request is
    answered at once instead of being held; retry after a back-off (RESOURCE_EXHAUSTED)."""

    reason = "TOO_MANY_REQUESTS"


class SystemBusyError(TooManyRequestsError):
    """The server cannot keep up with what it is offered (RocketMQ's SYSTEM_BUSY, "broker
    busy"): the request was refused before anything of it was written, so sending it again is
    safe. ``retry_after_ms`` is the server's hint for when to try again (milliseconds); it
    travels as gRPC's ``grpc-retry-pushback-ms`` trailer and a ``google.rpc.RetryInfo``."""

    reason = "SYSTEM_BUSY"

    def __init__(self, message: str, retry_after_ms: int = 100) -> None:
        super().__init__(message)
        self.retry_after_ms = max(0, int(retry_after_ms))

    def details(self) -> dict[str, str]:
        return {"retry_after_ms": str(self.retry_after_ms)}

    @classmethod
    def from_details(cls, message: str, details: dict[str, str]) -> StoreError:
        try:
            return cls(message, int(details.get("retry_after_ms", "100")))
        except ValueError:
            return cls(message)


class StoreIOError(StoreError):
    """An OSError hit the store's files; the store stops accepting writes (fail-stop)."""

    reason = "STORE_IO_ERROR"


class DiskFullError(StoreIOError):
    """No space left to allocate a new file."""

    reason = "DISK_FULL"


def nearest_entry(table: Mapping[type[BaseException], T], exc: BaseException, default: T) -> T:
    """``table``'s entry for the nearest class of ``exc`` in its class hierarchy (its method
    resolution order), ``default`` when no class of it has one: a subclass's entry wins over
    its base's whatever the table's order, so an error map follows the tree drawn above."""
    for cls in type(exc).__mro__:
        if cls in table:
            return table[cls]
    return default
