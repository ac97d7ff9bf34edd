"""Client credentials for the gateway's own API, and a Gateway stub that signs every call.

:class:`SignedGatewayStub` has the methods of ``mqstore.v1.Gateway``'s generated stub (each
callable as ``stub.Produce(request, timeout=...)`` and ``stub.Produce.future(...)``), but it
serializes the request itself, once, and signs exactly those bytes with the account's secret
(services.gateway.signature, ``MQSTORE-HMAC-SHA256``: date, method, SHA-256 of the request).
Each call, retries included, is signed at the moment it is sent, so a signature never outlives
the gateway's clock-skew window.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import message_factory

from services.gateway.signature import sign_own_request
from services.proto import gateway_pb

_SERVICE = gateway_pb.DESCRIPTOR.services_by_name["Gateway"]


@dataclass(frozen=True)
class Credentials:
    """An account of the gateway's accounts file (``accessKey``/``secretKey``)."""

    access_key: str
    secret_key: str

    def __repr__(self) -> str:  # never print the secret
        return f"Credentials(access_key={self.access_key!r})"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Credentials | None:
        """From ``MQSTORE_ACCESS_KEY`` and ``MQSTORE_SECRET_KEY`` (None when either is unset)."""
        env = os.environ if env is None else env
        ak, sk = env.get("MQSTORE_ACCESS_KEY", ""), env.get("MQSTORE_SECRET_KEY", "")
        return cls(ak, sk) if ak and sk else None


class SignedMethod:
    """One unary method: serialize, sign those bytes, send them as they are. The reply is
    parsed as ``response_type``, or handed over as its bytes when that is None."""

    def __init__(
        self, channel: grpc.Channel, method: str, response_type: Any, credentials: Credentials
    ) -> None:
        self._method = method
        self._credentials = credentials
        # No request serializer: the request goes out as the bytes that were signed.
        self._call = channel.unary_unary(
            method, response_deserializer=None if response_type is None else response_type.FromString
        )

    def _signed(
        self, request: Any, metadata: Sequence[tuple[str, str]] | None
    ) -> tuple[bytes, list[tuple[str, str]]]:
        raw = request.SerializeToString()
        creds = self._credentials
        signed = sign_own_request(creds.access_key, creds.secret_key, self._method, raw)
        return raw, [*(metadata or ()), *signed]

    def __call__(
        self, request: Any, timeout: float | None = None, metadata: Sequence[tuple[str, str]] | None = None
    ) -> Any:
        raw, md = self._signed(request, metadata)
        return self._call(raw, timeout=timeout, metadata=md)

    def future(
        self, request: Any, timeout: float | None = None, metadata: Sequence[tuple[str, str]] | None = None
    ) -> grpc.Future:
        raw, md = self._signed(request, metadata)
        return self._call.future(raw, timeout=timeout, metadata=md)


class SignedGatewayStub:
    """``mqstore.v1.Gateway`` over ``channel`` (a sync grpc.Channel), every call signed with
    ``credentials`` (module doc)."""

    def __init__(self, channel: grpc.Channel, credentials: Credentials) -> None:
        for method in _SERVICE.methods:
            response = gateway_pb.DESCRIPTOR.pool.FindMessageTypeByName(method.output_type.full_name)
            response_class = _message_class(response)
            setattr(
                self,
                method.name,
                SignedMethod(channel, f"/{_SERVICE.full_name}/{method.name}", response_class, credentials),
            )


def _message_class(descriptor: Any) -> Any:
    return message_factory.GetMessageClass(descriptor)
