"""Who is calling mqstore's own API: a server interceptor that authenticates every
``mqstore.v1.Gateway`` call before its servicer runs, and the account it found.

The own API's signature covers a SHA-256 of the request bytes as received
(services.gateway.signature), so the interceptor wraps the method's request deserializer to
hash the bytes on their way in; the servicer then asks :func:`current_account` and checks the
permission its request needs (services.gateway.acl). An unsigned call over mutual TLS (the
gateway run with ``--tls-client-ca``) authenticates by its verified certificate instead, when
the certificate's common name is mapped to an account (``certificateCommonName``). A call that
does not authenticate ends with UNAUTHENTICATED before the servicer sees it: nothing is read or
written for it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

import grpc

from services.gateway.acl import AccessControl, Account
from services.gateway.signature import authenticate_own, metadata_dict, request_digest

_CALLER: ContextVar[Account | None] = ContextVar("mqstore_caller", default=None)


def current_account() -> Account | None:
    """The account the running own-API call authenticated as (None outside one, or with the
    ACL off)."""
    return _CALLER.get()


class OwnApiAuthInterceptor(grpc.aio.ServerInterceptor):
    """Authenticates the unary methods whose full name starts with ``prefix`` against ``acl``;
    other services on the same server (RocketMQ 5's, health, reflection) pass untouched.
    Raises (to the error interceptor) libstore's AuthenticationError."""

    def __init__(self, acl: AccessControl, prefix: str = "/mqstore.v1.Gateway/") -> None:
        self.acl = acl
        self.prefix = prefix

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or not method.startswith(self.prefix):
            return handler
        if handler.unary_unary is None:  # every own-API method is unary; refuse anything else
            return grpc.unary_unary_rpc_method_handler(_unsupported)
        metadata = metadata_dict(handler_call_details.invocation_metadata)
        deserialize = handler.request_deserializer
        seen: list[str] = []

        def hashing(raw: bytes) -> Any:
            seen.append(request_digest(raw))
            return deserialize(raw) if deserialize is not None else raw

        inner = handler.unary_unary
        acl = self.acl

        async def authenticated(request: Any, context: grpc.aio.ServicerContext) -> Any:
            account = None
            if "authorization" not in metadata:
                account = acl.account_of_certificate(_certificate_cn(context))
            if account is None:
                account = authenticate_own(acl, metadata, method, seen[0] if seen else request_digest(b""))
            token = _CALLER.set(account)
            try:
                return await inner(request, context)
            finally:
                _CALLER.reset(token)

        return grpc.unary_unary_rpc_method_handler(authenticated, hashing, handler.response_serializer)


def _certificate_cn(context: grpc.aio.ServicerContext) -> str:
    """The common name of the client certificate the TLS handshake verified ("" without one:
    gRPC reports peer certificates only when the server required and checked them)."""
    names = context.auth_context().get("x509_common_name") or []
    return names[0].decode("utf-8", "replace") if len(names) == 1 else ""


async def _unsupported(request: Any, context: grpc.aio.ServicerContext) -> Any:
    await context.abort(grpc.StatusCode.UNIMPLEMENTED, "not an own-API method")
