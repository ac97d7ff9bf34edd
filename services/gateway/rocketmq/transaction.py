"""RocketMQ 5 transactions on the gateway: EndTransaction, and the check-backs of half messages
nobody ended, pushed to a connected producer of the topic over its Telemetry stream (spec sheet
rocketmq-grpc-v2 §3, "Transaction check").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc

from libstore import InvalidArgumentError
from libstore.message import MessageConst
from libstore.record_codec import decode_record
from services.gateway.acl import PUB
from services.gateway.rocketmq import convert
from services.gateway.rocketmq.activity import GatewayContext
from services.gateway.rocketmq.convert import V2Error
from services.gateway.rocketmq.pb import Code, definition, service
from services.ports import TransactionCheck

log = logging.getLogger(__name__)

CHECK_POLL_S = 1.0  # how often a gateway with producers claims transaction check-backs


class TransactionActivity:
    """EndTransaction and the check-back loop over ``ctx`` (module docstring). Raises V2Error."""

    def __init__(self, ctx: GatewayContext) -> None:
        self.ctx = ctx
        self._check_task: asyncio.Task[None] | None = None

    async def end_transaction(
        self, request: service.EndTransactionRequest, context: grpc.aio.ServicerContext
    ) -> service.EndTransactionResponse:
        if not request.transaction_id:
            raise V2Error(Code.INVALID_TRANSACTION_ID, "transaction id is empty")
        if not request.topic.name:
            raise V2Error(Code.ILLEGAL_TOPIC, "the transaction's topic is empty")
        self.ctx.authorize(context, PUB, request.topic.name)
        if request.resolution not in (definition.COMMIT, definition.ROLLBACK):
            raise V2Error(Code.BAD_REQUEST, "resolution must be COMMIT or ROLLBACK")
        try:
            await self.ctx.dispatch.end_transaction(
                request.transaction_id,
                request.message_id,
                request.resolution == definition.COMMIT,
                request.topic.name,  # the half message must be of this (authorized) topic
            )
        except InvalidArgumentError as exc:
            raise V2Error(Code.INVALID_TRANSACTION_ID, str(exc)) from None
        return service.EndTransactionResponse(status=convert.status())

    async def close(self) -> None:
        """Stop the check-back loop (the server has stopped)."""
        task, self._check_task = self._check_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def ensure_check_loop(self) -> None:
        if self._check_task is None or self._check_task.done():
            self._check_task = asyncio.create_task(self._run_checks())

    async def _run_checks(self) -> None:
        """Every CHECK_POLL_S, while producers are connected: claim the half messages due for a
        check-back of the topics they publish and push each to one of them (spec sheet §3,
        "Transaction check"). Failures are logged and retried on the next round."""
        while True:
            await asyncio.sleep(CHECK_POLL_S)
            topics = self.ctx.sessions.producer_topics()
            if not topics:
                continue
            try:
                checks = await self.ctx.dispatch.claim_transaction_checks(sorted(topics))
            except Exception as exc:
                log.warning("claiming transaction checks failed: %s", exc)
                continue
            for check in checks:
                self._push_check(check)

    def _push_check(self, check: TransactionCheck) -> None:
        rec = decode_record(check.record, check_crc=False)
        real = rec.properties.get(MessageConst.REAL_TOPIC, rec.topic)
        session = self.ctx.sessions.producer_of(real)
        if session is None:
            return  # the producer left meanwhile: the next check goes to another
        message = convert.consumer_message(
            rec, namespace="", receipt_handle="", attempt=check.check_times, invisible_ms=0
        )
        message.topic.name = real
        message.system_properties.message_type = definition.TRANSACTION
        queued = session.offer(
            service.TelemetryCommand(
                status=convert.status(),
                recover_orphaned_transaction_command=service.RecoverOrphanedTransactionCommand(
                    message=message, transaction_id=check.transaction_id
                ),
            )
        )
        if not queued:  # the producer does not read its stream: the check repeats next round
            log.warning("check-back of %s skipped: client %s is not reading", real, session.client_id)
