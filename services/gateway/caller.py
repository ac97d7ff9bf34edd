"""Who is calling mqstore's own API: a wrapper around every ``mqstore.v1.Gateway`` method that
authenticates each call before its servicer runs, and the account it found.

The own API's signature covers a SHA-256 of the request bytes as received
(services.gateway.signature), so the wrapper wraps the method's request deserializer to hash
the bytes on their way in; the servicer then asks :func:`current_account` and checks the
permission its request needs (services.gateway.acl). An unsigned call over mutual TLS (the
gateway run with ``--tls-client-ca``) authenticates by its verified certificate instead, when
the certificate's common name is mapped to an account (``certificateCommonName``). A call that
does not authenticate ends with UNAUTHENTICATED before the servicer sees it: nothing is read or
written for it.
"""

from __future__ import annotations

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


class OwnApiAuth:
    """Authenticates the unary methods whose full name starts with ``prefix`` against ``acl``;
    other services on the same server (RocketMQ 5's, health, reflection) pass untouched. A
    MethodWrapper (services._common.errors): applied to each method once, at registration.
    What it raises (libstore's AuthenticationError) is mapped by the error mapping around it."""

    def __init__(self, acl: AccessControl, prefix: str = "/mqstore.v1.Gateway/") -> None:
        self.acl = acl
        self.prefix = prefix

    def __call__(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        if not method.startswith(self.prefix):
            return handler
        if handler.unary_unary is None:  # every own-API method is unary; refuse anything else
            return grpc.unary_unary_rpc_method_handler(_unsupported)
        deserialize = handler.request_deserializer

        def hashing(raw: bytes) -> tuple[Any, str]:  # the request and the digest it is signed by
            return (deserialize(raw) if deserialize is not None else raw), request_digest(raw)

        inner = handler.unary_unary
        acl = self.acl

        async def authenticated(received: tuple[Any, str], context: grpc.aio.ServicerContext) -> Any:
            request, digest = received
            metadata = metadata_dict(context.invocation_metadata())
            account = None
            if "authorization" not in metadata:
                account = acl.account_of_certificate(_certificate_cn(context))
            if account is None:
                account = authenticate_own(acl, metadata, method, digest)
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
