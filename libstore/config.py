"""StoreConfig: one flat, frozen configuration object for the message store.

Field names are the snake_case of Apache RocketMQ's ``MessageStoreConfig`` (and a few
``BrokerConfig``) keys; each field's metadata carries the RocketMQ key (typos included, e.g.
``warmMapedFileEnable``) so a ``broker.conf`` loads unchanged, and the unit of the value.
Defaults are RocketMQ's (rocketmq-store-format spec sheet §8).

Precedence when building a config with :meth:`StoreConfig.from_sources`:
explicit overrides (CLI) > environment (``MQSTORE_<FIELD_NAME_UPPER>``) > properties file
(``key=value`` lines, RocketMQ or snake_case keys) > defaults. Keys of Apache RocketMQ's broker
that this store does not implement are ignored (logged), so a stock ``broker.conf`` loads; other
unknown keys and bad values raise :class:`libstore.errors.ConfigError`. No module reads
``os.environ`` itself: callers pass it in.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from libstore.errors import ConfigError
from libstore.rocketmq_keys import ROCKETMQ_KEYS

log = logging.getLogger(__name__)


class FlushDiskType(enum.Enum):
    """When an append counts as durable: after fsync (SYNC_FLUSH) or after the page-cache copy."""

    SYNC_FLUSH = "SYNC_FLUSH"
    ASYNC_FLUSH = "ASYNC_FLUSH"


class BrokerRole(enum.Enum):
    """Replication role of the store (spec §7)."""

    ASYNC_MASTER = "ASYNC_MASTER"
    SYNC_MASTER = "SYNC_MASTER"
    SLAVE = "SLAVE"


def _f(default: Any, key: str, unit: str = "", doc: str = "") -> Any:
    return field(default=default, metadata={"key": key, "unit": unit, "doc": doc})


ENV_PREFIX = "MQSTORE_"
RECORD_OVERHEAD_BOUND = 64 * 1024  # a record's header, topic and properties take less than this
MAX_BROKER_ID = 1000  # epochs are term * MAX_BROKER_ID + broker id (libstore.ha_state.next_epoch)


@dataclass(frozen=True, kw_only=True)
class StoreConfig:
    """Configuration of one store (CommitLog, queues, index, flush, HA).

    Sizes are bytes, intervals and timeouts milliseconds. Build with keyword arguments,
    :meth:`from_sources`, or :meth:`replace`; values are validated in ``__post_init__``
    (``ConfigError`` on a bad value).
    """

    store_path_root_dir: str = _f(
        str(Path.home() / "store"), "storePathRootDir", doc="root folder of the store (spec §0)"
    )
    store_path_commit_log: str = _f(
        "", "storePathCommitLog", doc="CommitLog folder; empty = <root>/commitlog"
    )
    mapped_file_size_commit_log: int = _f(
        1024 * 1024 * 1024, "mappedFileSizeCommitLog", "bytes", "size of one CommitLog file"
    )
    mapped_file_size_consume_queue: int = _f(
        300_000 * 20, "mappedFileSizeConsumeQueue", "bytes", "size of one ConsumeQueue file"
    )
    flush_disk_type: FlushDiskType = _f(FlushDiskType.ASYNC_FLUSH, "flushDiskType")
    broker_role: BrokerRole = _f(BrokerRole.ASYNC_MASTER, "brokerRole")
    flush_interval_commit_log: int = _f(500, "flushIntervalCommitLog", "ms", "ASYNC_FLUSH period")
    flush_commit_log_least_pages: int = _f(
        4, "flushCommitLogLeastPages", "pages", "ASYNC_FLUSH: flush only when this many 4 KiB pages are dirty"
    )
    flush_commit_log_thorough_interval: int = _f(
        10_000, "flushCommitLogThoroughInterval", "ms", "ASYNC_FLUSH: flush everything at least this often"
    )
    flush_commit_log_timed: bool = _f(True, "flushCommitLogTimed", doc="ASYNC_FLUSH sleeps a fixed period")
    commit_interval_commit_log: int = _f(
        200, "commitIntervalCommitLog", "ms", "transient store pool: commit period"
    )
    commit_commit_log_least_pages: int = _f(4, "commitCommitLogLeastPages", "pages")
    commit_commit_log_thorough_interval: int = _f(200, "commitCommitLogThoroughInterval", "ms")
    sync_flush_timeout: int = _f(
        5000, "syncFlushTimeout", "ms", "SYNC_FLUSH: FLUSH_DISK_TIMEOUT after this wait"
    )
    idle_loop_flush_wait_ms: int = _f(
        2,
        "idleLoopFlushWaitMs",
        "ms",
        "mqstore, SYNC_FLUSH: for a put that waits alone, a service's event loop with nothing else "
        "to do blocks up to this long for the group commit's round and answers as soon as it "
        "ends, instead of being woken for it (it runs nothing else meanwhile; skipped while the "
        "slowest recent round took longer); 0: never blocks",
    )
    max_message_size: int = _f(4 * 1024 * 1024, "maxMessageSize", "bytes", "largest accepted body")
    check_crc_on_recover: bool = _f(True, "checkCRCOnRecover")
    warm_mapped_file_enable: bool = _f(
        False, "warmMapedFileEnable", doc="write zeros to new CommitLog files, then mlock them"
    )
    flush_least_pages_when_warm_mapped_file: int = _f(4096, "flushLeastPagesWhenWarmMapedFile", "pages")
    preload_mapped_file_enable: bool = _f(
        False,
        "preloadMapedFileEnable",
        doc="mqstore: read new CommitLog files into the page cache while pre-allocating them. Off "
        "by default: appends but small ones use pwrite (no page faults to avoid), and pre-loading a 1 GiB "
        "segment costs about 2 s of kernel CPU",
    )
    data_read_ahead_enable: bool = _f(True, "dataReadAheadEnable", doc="false = madvise(MADV_RANDOM)")
    transient_store_pool_enable: bool = _f(False, "transientStorePoolEnable")
    transient_store_pool_size: int = _f(5, "transientStorePoolSize", "buffers")
    fast_fail_if_no_buffer_in_store_pool: bool = _f(False, "fastFailIfNoBufferInStorePool")
    transient_store_max_bytes: int = _f(
        256 * 1024 * 1024,
        "transientStoreMaxBytes",
        "bytes",
        "mqstore: memory held by transient messages (libstore.durability; not RocketMQ's transient "
        "store pool). Past 3/4 of it the oldest are paged out to scratch files under "
        "<root>/transient, deleted on start",
    )
    transient_scratch_max_bytes: int = _f(
        1024 * 1024 * 1024,
        "transientScratchMaxBytes",
        "bytes",
        "mqstore: scratch file bytes transient messages may be paged out to; past it, and "
        "transientStoreMaxBytes, puts of transient messages get SYSTEM_BUSY (0: never page out)",
    )
    os_page_cache_busy_time_out_mills: int = _f(1000, "osPageCacheBusyTimeOutMills", "ms")
    store_host: str = _f(
        "127.0.0.1:10911", "storeHost", doc="ip:port recorded as STOREHOST and in message ids (spec §2)"
    )
    auto_create_topic_enable: bool = _f(True, "autoCreateTopicEnable")
    default_topic_queue_nums: int = _f(8, "defaultTopicQueueNums", "queues")
    max_topic_length: int = _f(127, "maxTopicLength", "bytes")
    max_queue_nums_per_topic: int = _f(
        1024, "maxQueueNumsPerTopic", "queues", "mqstore: upper bound of a topic's queue count"
    )
    max_topic_count: int = _f(
        1024,
        "maxTopicCount",
        "topics",
        "mqstore: most topics the store holds, system topics aside; creating one more (by hand or "
        "by auto-create) is refused. Each queue that receives messages maps a ConsumeQueue file",
    )
    max_group_name_length: int = _f(
        255,
        "maxGroupNameLength",
        "bytes",
        "mqstore: longest consumer group name (RocketMQ's Validators.CHARACTER_MAX_LENGTH); names use "
        "a topic's characters [A-Za-z0-9_%|-]",
    )
    max_messages_per_request: int = _f(
        1024,
        "maxMessagesPerRequest",
        "messages",
        "mqstore: most messages one produce or send carries (either Produce form, RocketMQ 5 SendMessage)",
    )
    max_request_bytes: int = _f(
        32 * 1024 * 1024,
        "maxRequestBytes",
        "bytes",
        "mqstore: largest produce or send request (its encoded size); each message's body is still "
        "bound by maxMessageSize",
    )
    offload_validation_bytes: int = _f(
        2 * 1024 * 1024,
        "offloadValidationBytes",
        "bytes",
        "mqstore: client-encoded record batches larger than this are validated on a worker thread; "
        "validating holds the GIL, so the event loop gets it back every switch interval (5 ms) "
        "instead of waiting for the whole batch. Smaller ones (at most maxMessagesPerRequest "
        "records: a few ms) are validated on the loop, which the hop would only slow",
    )
    max_read_ranges_per_call: int = _f(
        1024,
        "maxReadRangesPerCall",
        "ranges",
        "mqstore: most records one commitlog Read call asks for (at least maxPullBatchSize)",
    )
    max_read_bytes_per_call: int = _f(
        32 * 1024 * 1024,
        "maxReadBytesPerCall",
        "bytes",
        "mqstore: most record bytes one commitlog Read call returns (at least maxMessageSize + 64 KiB)",
    )
    max_held_polls: int = _f(
        4096,
        "maxHeldPolls",
        "polls",
        "mqstore: most long polls (Pull with wait, RocketMQ 5 ReceiveMessage, dispatch waits) held at "
        "once by a gateway or a dispatch service; past it a poll is answered at once",
    )
    max_held_polls_per_client: int = _f(
        64,
        "maxHeldPollsPerClient",
        "polls",
        "mqstore: most long polls a gateway holds for one client connection; past it a poll that "
        "finds nothing is answered at once with RESOURCE_EXHAUSTED / TOO_MANY_REQUESTS",
    )
    wait_time_mills_in_send_queue: int = _f(
        200,
        "waitTimeMillsInSendQueue",
        "ms",
        "gateway: when calls wait longer than this before they run (the event loop's lag), new "
        "produce and send calls are refused at once with RESOURCE_EXHAUSTED / SYSTEM_BUSY and a "
        'retry hint, as RocketMQ\'s broker answers "broker busy"',
    )
    max_inflight_produce_bytes: int = _f(
        256 * 1024 * 1024,
        "maxInflightProduceBytes",
        "bytes",
        "mqstore: most request bytes of produce and send calls a gateway holds at once (being "
        "appended or waiting for flush or replica); one more is refused with RESOURCE_EXHAUSTED / "
        "SYSTEM_BUSY and a retry hint (at least maxRequestBytes)",
    )
    telemetry_outbox_max_commands: int = _f(
        64,
        "telemetryOutboxMaxCommands",
        "commands",
        "gateway (RocketMQ 5 protocol): server-to-client commands queued per Telemetry stream; when "
        "full, the stream's commands are no longer read and check-backs skip it",
    )
    telemetry_max_streams_per_client: int = _f(
        16,
        "telemetryMaxStreamsPerClient",
        "streams",
        "gateway (RocketMQ 5 protocol): open Telemetry streams per client id; one more is refused "
        "with TOO_MANY_REQUESTS",
    )
    flush_interval_consume_queue: int = _f(
        1000, "flushIntervalConsumeQueue", "ms", "ConsumeQueue and IndexFile flush period"
    )
    flush_consume_queue_least_pages: int = _f(2, "flushConsumeQueueLeastPages", "pages")
    flush_consume_queue_thorough_interval: int = _f(
        60_000,
        "flushConsumeQueueThoroughInterval",
        "ms",
        "flush every ConsumeQueue and IndexFile, then save the dispatch checkpoint, this often; "
        "a crash replays at most this much of the log into them",
    )
    message_index_enable: bool = _f(True, "messageIndexEnable", doc="build IndexFiles (keys, unique keys)")
    max_hash_slot_num: int = _f(5_000_000, "maxHashSlotNum", "slots", "hash slots per IndexFile")
    max_index_num: int = _f(20_000_000, "maxIndexNum", "entries", "entries per IndexFile")
    max_msgs_num_batch: int = _f(64, "maxMsgsNumBatch", "messages", "most offsets one key query returns")
    max_transfer_bytes_on_message_in_memory: int = _f(
        256 * 1024, "maxTransferBytesOnMessageInMemory", "bytes", "a pull returns at most this much"
    )
    max_pull_batch_size: int = _f(
        1024, "maxPullBatchSize", "messages", "mqstore: a pull asking for more is refused"
    )
    long_polling_hold_time: int = _f(
        30_000, "longPollingHoldTime", "ms", "mqstore: longest a pull may wait for new messages"
    )
    flush_consumer_offset_interval: int = _f(
        5000, "flushConsumerOffsetInterval", "ms", "how often consumer offsets are persisted"
    )
    transaction_timeout: int = _f(
        6000, "transactionTimeOut", "ms", "a half message this old is checked back with its producer"
    )
    transaction_check_interval: int = _f(
        30_000, "transactionCheckInterval", "ms", "time between two check-backs of one half message"
    )
    transaction_check_max: int = _f(
        15, "transactionCheckMax", "checks", "check-backs before an unresolved half message is dropped"
    )
    default_invisible_time: int = _f(
        60_000,
        "defaultInvisibleTimeMills",
        "ms",
        "gateway (RocketMQ 5 protocol): a push consumer's messages stay invisible this long per renewal",
    )
    min_invisible_time_for_recv: int = _f(
        10_000,
        "minInvisibleTimeMillsForRecv",
        "ms",
        "gateway (RocketMQ 5 protocol): shortest invisible time a receive may ask for",
    )
    max_invisible_time: int = _f(
        12 * 3600 * 1000,
        "maxInvisibleTimeMills",
        "ms",
        "gateway (RocketMQ 5 protocol): longest invisible time a receive or change may ask for",
    )
    invisible_time_when_clear: int = _f(
        1000,
        "invisibleTimeMillisWhenClear",
        "ms",
        "gateway (RocketMQ 5 protocol): a departed push consumer's deliveries show again this soon",
    )
    renew_ahead_time: int = _f(
        10_000, "renewAheadTimeMillis", "ms", "gateway: renew a push delivery this long before it shows again"
    )
    renew_max_time: int = _f(
        3 * 3600 * 1000, "renewMaxTimeMillis", "ms", "gateway: stop renewing a push delivery after this long"
    )
    broker_name: str = _f("broker-a", "brokerName", doc="the broker group this store belongs to")
    pop_receipt_key_file: str = _f(
        "",
        "popReceiptKeyFile",
        doc="mqstore dispatch: the broker group's shared key for signing receipt handles (a file: "
        "32 bytes or their hex); empty: each dispatch makes its own under its data folder",
    )
    broker_id: int = _f(0, "brokerId", doc="0 for the master of the group, 1.. for slaves")
    ha_master_address: str = _f(
        "", "haMasterAddress", doc="SLAVE: host:port of the master's replication (HA) endpoint"
    )
    ha_send_heartbeat_interval: int = _f(
        5000, "haSendHeartbeatInterval", "ms", "idle streams carry a heartbeat this often"
    )
    ha_housekeeping_interval: int = _f(
        20_000, "haHousekeepingInterval", "ms", "a replication stream silent this long is dropped"
    )
    ha_transfer_batch_size: int = _f(
        1024 * 1024,
        "haTransferBatchSize",
        "bytes",
        "largest chunk of log bytes in one replication frame. mqstore: 1 MiB (RocketMQ: 32 KiB over "
        "raw TCP); a gRPC frame costs about what copying 32 KiB does, and a 1 GiB catch-up ran at "
        "32 MB/s with 32 KiB frames, 188 MB/s with 1 MiB",
    )
    ha_max_gap_not_in_sync: int = _f(
        256 * 1024 * 1024,
        "haMaxGapNotInSync",
        "bytes",
        "a slave this far behind is not in sync (SYNC_MASTER puts fail with SLAVE_NOT_AVAILABLE)",
    )
    slave_timeout: int = _f(3000, "slaveTimeout", "ms", "SYNC_MASTER: FLUSH_SLAVE_TIMEOUT after this wait")
    in_sync_replicas: int = _f(
        1,
        "inSyncReplicas",
        "replicas",
        "copies a SYNC_MASTER put needs, counting the master (RocketMQ 5); at least one slave is "
        "always required under SYNC_MASTER (RocketMQ 4.9)",
    )
    ha_max_time_slave_not_catchup: int = _f(
        15_000,
        "haMaxTimeSlaveNotCatchup",
        "ms",
        "with an election (--election etcd): a slave that has not caught up with the master for this "
        "long leaves the SyncStateSet (RocketMQ 5 controller mode); one that disconnects leaves at once",
    )
    enable_elect_unclean_master: bool = _f(
        False,
        "enableElectUncleanMaster",
        doc="with an election: when no member of the SyncStateSet is alive, elect the furthest live "
        "member anyway (acknowledged messages it lacks are lost; RocketMQ 5's controller key, Kafka's "
        "unclean.leader.election.enable)",
    )
    election_lease_ttl_millis: int = _f(
        3000,
        "electionLeaseTtlMillis",
        "ms",
        "mqstore: with an election, the etcd session lease of each member (whole seconds, at least "
        "2 s); a master that cannot renew it stops acknowledging before it runs out",
    )
    election_check_interval_millis: int = _f(
        200,
        "electionCheckIntervalMillis",
        "ms",
        "mqstore: with an election, how often a member reads the group's state in etcd",
    )
    slave_read_enable: bool = _f(
        False,
        "slaveReadEnable",
        doc="gateway: read records far behind the master's end from a slave (RocketMQ BrokerConfig)",
    )
    access_message_in_memory_max_ratio: int = _f(
        40,
        "accessMessageInMemoryMaxRatio",
        "percent",
        "with slaveReadEnable: records further behind the master's end than this share of RAM are "
        "read from a slave",
    )
    # -- retention (spec §9: RocketMQ's CleanCommitLogService) ----------------------------------
    file_reserved_time: int = _f(
        72, "fileReservedTime", "hours", "a CommitLog segment unmodified this long is expired"
    )
    delete_when: str = _f(
        "04",
        "deleteWhen",
        "hours",
        "local hours (00-23, ';'-separated) in which expired segments are deleted; any hour when the "
        "disk passes diskMaxUsedSpaceRatio",
    )
    disk_max_used_space_ratio: int = _f(
        75, "diskMaxUsedSpaceRatio", "percent", "past this disk usage expired segments go at any hour"
    )
    disk_space_clean_forcibly_ratio: int = _f(
        85,
        "diskSpaceCleanForciblyRatio",
        "percent",
        "past this disk usage the oldest segments go even unexpired (with cleanFileForciblyEnable)",
    )
    disk_space_warning_level_ratio: int = _f(
        90,
        "diskSpaceWarningLevelRatio",
        "percent",
        "past this disk usage the store is marked disk-full and refuses puts until cleanup brings "
        "it back under",
    )
    clean_file_forcibly_enable: bool = _f(
        True, "cleanFileForciblyEnable", doc="delete unexpired segments past diskSpaceCleanForciblyRatio"
    )
    clean_resource_interval: int = _f(10_000, "cleanResourceInterval", "ms", "how often cleanup runs")
    delete_commit_log_files_interval: int = _f(
        100, "deleteCommitLogFilesInterval", "ms", "pause between two CommitLog segment deletions"
    )
    delete_consume_queue_files_interval: int = _f(
        100, "deleteConsumeQueueFilesInterval", "ms", "pause between two ConsumeQueue file deletions"
    )
    delete_file_batch_max: int = _f(10, "deleteFileBatchMax", "files", "most segments deleted per round")
    queue_offset_snapshot_interval: int = _f(
        10_000,
        "queueOffsetSnapshotInterval",
        "ms",
        "mqstore: how often the queue-offset table is saved so a crash recovery rescans only the tail",
    )

    def __post_init__(self) -> None:
        positive = (
            "mapped_file_size_commit_log",
            "mapped_file_size_consume_queue",
            "flush_interval_commit_log",
            "flush_commit_log_thorough_interval",
            "commit_interval_commit_log",
            "sync_flush_timeout",
            "max_message_size",
            "transient_store_pool_size",
            "transient_store_max_bytes",
            "os_page_cache_busy_time_out_mills",
            "default_topic_queue_nums",
            "max_topic_length",
            "max_queue_nums_per_topic",
            "max_topic_count",
            "max_group_name_length",
            "max_messages_per_request",
            "max_request_bytes",
            "max_read_ranges_per_call",
            "max_read_bytes_per_call",
            "max_held_polls",
            "max_held_polls_per_client",
            "wait_time_mills_in_send_queue",
            "max_inflight_produce_bytes",
            "telemetry_outbox_max_commands",
            "telemetry_max_streams_per_client",
            "queue_offset_snapshot_interval",
            "flush_interval_consume_queue",
            "flush_consume_queue_thorough_interval",
            "max_hash_slot_num",
            "max_index_num",
            "max_msgs_num_batch",
            "max_transfer_bytes_on_message_in_memory",
            "max_pull_batch_size",
            "long_polling_hold_time",
            "flush_consumer_offset_interval",
            "transaction_timeout",
            "transaction_check_interval",
            "transaction_check_max",
            "default_invisible_time",
            "min_invisible_time_for_recv",
            "max_invisible_time",
            "invisible_time_when_clear",
            "renew_ahead_time",
            "renew_max_time",
            "ha_send_heartbeat_interval",
            "ha_housekeeping_interval",
            "ha_transfer_batch_size",
            "ha_max_gap_not_in_sync",
            "slave_timeout",
            "in_sync_replicas",
            "ha_max_time_slave_not_catchup",
            "election_check_interval_millis",
            "file_reserved_time",
            "clean_resource_interval",
            "delete_file_batch_max",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)!r}")
        non_negative = (
            "flush_commit_log_least_pages",
            "commit_commit_log_least_pages",
            "commit_commit_log_thorough_interval",
            "flush_least_pages_when_warm_mapped_file",
            "flush_consume_queue_least_pages",
            "broker_id",
            "offload_validation_bytes",
            "transient_scratch_max_bytes",
            "delete_commit_log_files_interval",
            "delete_consume_queue_files_interval",
            "access_message_in_memory_max_ratio",  # 0: no record counts as in memory
            "idle_loop_flush_wait_ms",
        )
        for name in non_negative:
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if self.mapped_file_size_commit_log % 4096:
            raise ConfigError("mapped_file_size_commit_log must be a multiple of 4096 bytes")
        if self.mapped_file_size_commit_log < 64 * 1024:
            raise ConfigError("mapped_file_size_commit_log must be at least 65536 bytes")
        if self.mapped_file_size_consume_queue < 20:
            raise ConfigError("mapped_file_size_consume_queue must hold at least one 20-byte unit")
        if self.max_index_num < 2:
            raise ConfigError("max_index_num must be at least 2 (entry 0 is unused)")
        if self.max_message_size + 64 * 1024 > self.mapped_file_size_commit_log:
            raise ConfigError(
                "mapped_file_size_commit_log must hold the largest record: "
                f"max_message_size ({self.max_message_size}) + 64 KiB > {self.mapped_file_size_commit_log}"
            )
        if self.max_read_ranges_per_call < self.max_pull_batch_size:
            raise ConfigError("max_read_ranges_per_call must be at least max_pull_batch_size")
        if self.max_read_bytes_per_call < self.max_message_size + 64 * 1024:
            raise ConfigError(
                "max_read_bytes_per_call must hold the largest record (max_message_size + 64 KiB)"
            )
        if self.max_request_bytes < self.max_message_size:
            raise ConfigError("max_request_bytes must be at least max_message_size")
        if self.max_inflight_produce_bytes < self.max_request_bytes:
            raise ConfigError("max_inflight_produce_bytes must be at least max_request_bytes")
        for name in (
            "disk_max_used_space_ratio",
            "disk_space_clean_forcibly_ratio",
            "disk_space_warning_level_ratio",
        ):
            if not 1 <= getattr(self, name) <= 99:
                raise ConfigError(f"{name} is a percentage within 1..99, got {getattr(self, name)!r}")
        if self.disk_space_clean_forcibly_ratio > self.disk_space_warning_level_ratio:
            raise ConfigError("disk_space_clean_forcibly_ratio exceeds disk_space_warning_level_ratio")
        self.delete_hours  # noqa: B018 - validates delete_when
        if self.max_held_polls_per_client > self.max_held_polls:
            raise ConfigError("max_held_polls_per_client exceeds max_held_polls")
        if self.default_topic_queue_nums > self.max_queue_nums_per_topic:
            raise ConfigError("default_topic_queue_nums exceeds max_queue_nums_per_topic")
        if self.election_lease_ttl_millis < 2000:
            raise ConfigError(
                "election_lease_ttl_millis must be at least 2000 (etcd grants whole seconds, and a "
                f"master must renew well before its lease runs out), got {self.election_lease_ttl_millis!r}"
            )
        if self.transient_store_pool_enable and self.broker_role is BrokerRole.SLAVE:
            raise ConfigError("transient_store_pool_enable is not allowed on a SLAVE (RocketMQ rule)")
        _parse_host(self.store_host)
        if not 0 <= self.broker_id < MAX_BROKER_ID:
            raise ConfigError(
                f"broker_id must be within 0..{MAX_BROKER_ID - 1} (it is part of epoch numbers)"
            )
        if not self.broker_name or not all(c.isalnum() or c in "-_." for c in self.broker_name):
            raise ConfigError(f"broker_name must be non-empty [A-Za-z0-9._-], got {self.broker_name!r}")

    @property
    def delete_hours(self) -> frozenset[int]:
        """The local hours of ``delete_when`` ("04;05" -> {4, 5}). Raises ConfigError."""
        hours: set[int] = set()
        for part in self.delete_when.split(";"):
            part = part.strip()
            if not part:
                continue
            if not part.isdigit() or not 0 <= int(part) <= 23:
                raise ConfigError(f"delete_when lists hours 00-23 separated by ';', got {self.delete_when!r}")
            hours.add(int(part))
        return frozenset(hours)

    # -- derived paths -----------------------------------------------------------------------
    @property
    def commit_log_dir(self) -> Path:
        """Folder of the CommitLog files."""
        return Path(self.store_path_commit_log or os.path.join(self.store_path_root_dir, "commitlog"))

    @property
    def max_record_size(self) -> int:
        """The largest CommitLog record a message of ``max_message_size`` makes (bytes)."""
        return self.max_message_size + RECORD_OVERHEAD_BOUND

    @property
    def root_dir(self) -> Path:
        return Path(self.store_path_root_dir)

    @property
    def store_host_address(self) -> tuple[str, int]:
        """``store_host`` as (ip, port)."""
        return _parse_host(self.store_host)

    def replace(self, **changes: Any) -> StoreConfig:
        """A copy with ``changes`` applied (validated)."""
        return dataclasses.replace(self, **changes)

    # -- loading -----------------------------------------------------------------------------
    @classmethod
    def keys(cls) -> dict[str, str]:
        """Map every accepted key (RocketMQ camelCase and snake_case field name) to the field name."""
        out: dict[str, str] = {}
        for f in dataclasses.fields(cls):
            out[f.name] = f.name
            out[f.metadata["key"]] = f.name
        return out

    @classmethod
    def from_sources(
        cls,
        *,
        conf_file: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        overrides: Mapping[str, Any] | None = None,
        defaults: Mapping[str, Any] | None = None,
    ) -> StoreConfig:
        """Build a config from a properties file, ``MQSTORE_*`` environment variables and overrides.

        ``conf_file`` lines are ``key=value`` (``#`` comments), keys in RocketMQ spelling or
        snake_case. ``defaults`` replace the built-in defaults (the lowest precedence: a role's
        own defaults). Raises ConfigError on an unknown key (not ours, not RocketMQ's), a value
        that does not parse, or a missing file.
        """
        keys = cls.keys()
        values: dict[str, Any] = {}
        for key, raw in (defaults or {}).items():
            values[keys.get(key, key)] = raw
        if conf_file is not None:
            for key, raw in _read_properties(Path(conf_file)).items():
                values.pop(keys.get(key, ""), None)  # one spelling per field: the file's wins
                values[key] = raw
        if env:
            fields = {f.name.upper(): f.name for f in dataclasses.fields(cls)}
            for name, raw in env.items():
                if not name.startswith(ENV_PREFIX):
                    continue
                key = name[len(ENV_PREFIX) :]
                if key in fields:
                    values[fields[key]] = raw
        if overrides:
            for key, raw in overrides.items():
                if raw is not None:
                    values[key] = raw
        return cls.from_mapping(values)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> StoreConfig:
        """Build from ``{key: value}``; string values are parsed to the field's type.

        A key Apache RocketMQ's broker knows but this store does not implement (its cluster
        name, name server address, thread pool sizes...) is ignored, and the ignored keys are
        logged once per call, so a stock ``broker.conf`` loads. Raises ConfigError for a key
        neither knows (naming the closest known key) and for a value that does not parse."""
        keys = cls.keys()
        types = {f.name: f.type for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        ignored: list[str] = []
        for key, raw in values.items():
            name = keys.get(key)
            if name is None:
                if key in ROCKETMQ_KEYS:
                    ignored.append(key)
                    continue
                close = difflib.get_close_matches(key, [*keys, *ROCKETMQ_KEYS], n=1, cutoff=0.6)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ConfigError(f"unknown config key {key!r}{hint}")
            kwargs[name] = _coerce(name, types[name], raw)
        if ignored:
            log.warning(
                "ignoring RocketMQ config keys that mqstore does not implement: %s",
                ", ".join(sorted(ignored)),
            )
        return cls(**kwargs)

    def describe(self) -> dict[str, Any]:
        """The config as ``{rocketmq_key: value}`` (enums as their names)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[f.metadata["key"]] = v.value if isinstance(v, enum.Enum) else v
        return out


def _parse_host(text: str) -> tuple[str, int]:
    import ipaddress

    host, sep, port = text.rpartition(":")
    if not sep:
        raise ConfigError(f"store host {text!r} must be ip:port")
    host = host.strip("[]")
    try:
        ipaddress.ip_address(host)
        port_num = int(port)
    except ValueError as exc:
        raise ConfigError(f"store host {text!r} must be a numeric ip:port") from exc
    if not 0 <= port_num <= 65535:
        raise ConfigError(f"store host port out of range in {text!r}")
    return host, port_num


def _coerce(name: str, typ: Any, raw: Any) -> Any:
    typ_name = typ if isinstance(typ, str) else getattr(typ, "__name__", str(typ))
    try:
        if typ_name == "bool":
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in ("true", "1", "yes", "on"):
                return True
            if text in ("false", "0", "no", "off"):
                return False
            raise ValueError(raw)
        if typ_name == "int":
            if isinstance(raw, bool):
                raise ValueError(raw)
            return int(raw) if not isinstance(raw, str) else int(raw.strip().replace("_", ""))
        if typ_name == "str":
            return str(raw)
        if typ_name == "FlushDiskType":
            return raw if isinstance(raw, FlushDiskType) else FlushDiskType(str(raw).strip().upper())
        if typ_name == "BrokerRole":
            return raw if isinstance(raw, BrokerRole) else BrokerRole(str(raw).strip().upper())
    except ValueError as exc:
        raise ConfigError(f"bad value for {name}: {raw!r}") from exc
    raise ConfigError(f"unsupported config type for {name}: {typ_name}")


def _read_properties(path: Path) -> dict[str, str]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    out: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ConfigError(f"{path}:{lineno}: expected key=value")
        out[key.strip()] = value.strip()
    return out
