"""Converters between the dispatch service's objects and mqstore.v1 messages (DispatchService,
and the gateway's calls that carry the same shapes): pull status, subscription groups, consumer
progress, ConsumeQueue entries. Kept apart from the servicer so that the clients need not import
the service."""

from __future__ import annotations

from typing import cast

from libstore.results import GetMessageStatus
from libstore.subscription_group import CONSUME_FROM_LATEST, SubscriptionGroupConfig
from services.ports import Entries
from services.proto import common_pb, dispatch_pb

# Value() is typed as a plain int; each is one of the enum's values by construction.
PULL_STATUS_TO_PB = {
    s: cast("common_pb.PullStatus", common_pb.PullStatus.Value(s.name)) for s in GetMessageStatus
}
PULL_STATUS_FROM_PB = {v: k for k, v in PULL_STATUS_TO_PB.items()}


def group_to_pb(c: SubscriptionGroupConfig) -> dispatch_pb.SubscriptionGroup:
    return dispatch_pb.SubscriptionGroup(
        group_name=c.group_name,
        consume_enable=c.consume_enable,
        retry_max_times=c.retry_max_times,
        consume_message_orderly=c.consume_message_orderly,
        consume_from=c.consume_from,
    )


def group_from_pb(m: dispatch_pb.SubscriptionGroup) -> SubscriptionGroupConfig:
    return SubscriptionGroupConfig(
        m.group_name,
        consume_enable=m.consume_enable,
        retry_max_times=m.retry_max_times,
        consume_message_orderly=m.consume_message_orderly,
        consume_from=m.consume_from or CONSUME_FROM_LATEST,
    )


def progress_to_pb(group: str, topic: str, queues: list) -> dispatch_pb.ConsumerProgress:
    return dispatch_pb.ConsumerProgress(
        group=group,
        topic=topic,
        queues=[
            dispatch_pb.QueueProgress(
                queue_id=q.queue_id,
                committed_offset=q.committed_offset,
                min_offset=q.min_offset,
                max_offset=q.max_offset,
                lag=q.lag,
                expired=q.expired,
            )
            for q in queues
        ],
        total_lag=sum(q.lag for q in queues),
        total_expired=sum(q.expired for q in queues),
    )


def entries_to_pb(e: Entries) -> dispatch_pb.GetEntriesResponse:
    return dispatch_pb.GetEntriesResponse(
        status=PULL_STATUS_TO_PB[e.status],
        next_offset=e.next_offset,
        min_offset=e.min_offset,
        max_offset=e.max_offset,
        queue_offsets=e.queue_offsets,
        phy_offsets=e.phy_offsets,
        sizes=e.sizes,
    )
