"""Resource namespaces of the RocketMQ 5 protocol (``Resource.resource_namespace``).

A client configured with namespace ``nsA`` names its topic ``T1`` and its group ``G1``; the
store keeps them as ``nsA%T1`` and ``nsA%G1`` (RocketMQ's ``NamespaceUtil.wrapNamespace``), so
two namespaces never meet, and the client sees ``T1`` again (with ``resource_namespace`` set)
in whatever comes back. Retry and dead-letter names keep their prefix first:
``%DLQ%nsA%G1``. A client without a namespace reaches the plain names, as in RocketMQ.

:func:`wrap_request` rewrites every Resource of a request in place; :func:`unwrap_response` does
the reverse for a response. Both walk only the fields that are set, and the servicer calls them
only for a client that sends a namespace (the ``x-mq-namespace`` header), so the common case
costs nothing.
"""

from __future__ import annotations

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from services.gateway.rocketmq.pb import definition

SEPARATOR = "%"
_SYSTEM_PREFIXES = ("%RETRY%", "%DLQ%")
_RESOURCE = definition.Resource.DESCRIPTOR


def wrap(namespace: str, name: str) -> str:
    """``name`` of ``namespace`` as the store keeps it (unchanged for no namespace, or a name
    that already carries it)."""
    if not namespace or not name:
        return name
    prefix = next((p for p in _SYSTEM_PREFIXES if name.startswith(p)), "")
    rest = name[len(prefix) :]
    if rest.startswith(namespace + SEPARATOR):
        return name
    return f"{prefix}{namespace}{SEPARATOR}{rest}"


def unwrap(namespace: str, name: str) -> str:
    """The inverse of :func:`wrap`: ``name`` without ``namespace`` (unchanged when it does not
    carry it)."""
    if not namespace:
        return name
    prefix = next((p for p in _SYSTEM_PREFIXES if name.startswith(p)), "")
    rest = name[len(prefix) :]
    marker = namespace + SEPARATOR
    return prefix + rest[len(marker) :] if rest.startswith(marker) else name


def _repeated(field: FieldDescriptor) -> bool:
    """Whether ``field`` is repeated (``is_repeated`` in protobuf 6+, ``label`` before it)."""
    flag = getattr(field, "is_repeated", None)
    if flag is not None:
        return bool(flag)
    return field.label == FieldDescriptor.LABEL_REPEATED  # type: ignore[attr-defined]  # not in protobuf 6's stubs


def _resources(message: Message) -> list[Message]:
    """Every Resource set in ``message``, at any depth."""
    found: list[Message] = []
    stack = [message]
    while stack:
        current = stack.pop()
        for field, value in current.ListFields():
            kind = field.message_type
            if field.type != FieldDescriptor.TYPE_MESSAGE or kind is None or kind.GetOptions().map_entry:
                continue
            items = value if _repeated(field) else (value,)
            if field.message_type is _RESOURCE:
                found.extend(items)
            else:
                stack.extend(items)
    return found


def wrap_request(request: Message) -> None:
    """Rewrite each Resource of ``request`` that names a namespace to the store's name."""
    for resource in _resources(request):
        ns = resource.resource_namespace  # type: ignore[attr-defined]
        if ns:
            resource.name = wrap(ns, resource.name)  # type: ignore[attr-defined]


def unwrap_response(response: Message, namespace: str) -> None:
    """Rewrite each Resource of ``response`` that carries ``namespace`` to the client's name,
    with ``resource_namespace`` set."""
    for resource in _resources(response):
        name = resource.name  # type: ignore[attr-defined]
        plain = unwrap(namespace, name)
        if plain != name:
            resource.name = plain  # type: ignore[attr-defined]
            resource.resource_namespace = namespace  # type: ignore[attr-defined]
