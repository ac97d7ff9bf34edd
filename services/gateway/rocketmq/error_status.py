"""What a failed RocketMQ 5 call tells the client: the proxy's code, and a message that never
carries the server's internals.

Errors about the client's own request (a bad argument or name, an unknown topic, message or
receipt handle, a refused permission, a bound reached) keep their specific message: the client
needs it to fix its request. Anything else (an I/O failure, a corrupt record, a bug) answers
with a generic message and a correlation id; the details, with that id, go to the server's log.
"""

from __future__ import annotations

import logging
import uuid

from libstore import errors as E
from services.gateway.rocketmq import convert
from services.gateway.rocketmq.convert import V2Error
from services.gateway.rocketmq.pb import Code, definition

log = logging.getLogger("services.gateway.rocketmq")

# Store errors that describe the caller's request or a state it must react to; their messages
# name only what the client sent or may know.
_CLIENT_ERRORS: tuple[type[E.StoreError], ...] = (
    E.MessageIllegalError,
    E.InvalidArgumentError,
    E.TopicNotFoundError,
    E.MessageNotFoundError,
    E.OffsetOutOfRangeError,
    E.NotMasterError,
    E.OSPageCacheBusyError,
    E.TooManyRequestsError,
    E.DiskFullError,  # raised to callers only as the disk-full refusal, which names no path
)


def error_status(exc: Exception, rpc: str) -> definition.Status:
    """The Status a call that raised ``exc`` answers with (``rpc`` names the call in the log).

    V2Error and client errors (module docstring): their code and message. Other store errors
    keep their code but answer a generic message; anything else is INTERNAL_SERVER_ERROR. Both
    are logged with a correlation id that the message repeats.
    """
    if isinstance(exc, (V2Error, *_CLIENT_ERRORS)):
        return convert.status(convert.code_of_error(exc), str(exc))
    correlation = uuid.uuid4().hex[:16]
    log.error("%s failed (correlation id %s)", rpc, correlation, exc_info=exc)
    code = convert.code_of_error(exc) if isinstance(exc, E.StoreError) else Code.INTERNAL_SERVER_ERROR
    return convert.status(code, f"internal error; correlation id {correlation}")
