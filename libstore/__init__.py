"""libstore: a RocketMQ-style message storage engine (CommitLog, flush, checkpoint, recovery).

The public surface is listed in ``__all__`` and pinned by tests/unit/libstore/test_exports.py.
"""

from libstore.commit_log import AppendResult, CommitLog
from libstore.config import BrokerRole, FlushDiskType, StoreConfig
from libstore.errors import (
    ConfigError,
    CorruptRecordError,
    DiskFullError,
    IllegalTopicError,
    InvalidArgumentError,
    MessageIllegalError,
    NotMasterError,
    OffsetOutOfRangeError,
    OSPageCacheBusyError,
    PropertiesSizeExceededError,
    QueueIdOutOfRangeError,
    ServiceNotAvailableError,
    StoreError,
    StoreIOError,
    StoreLockedError,
    TopicNotFoundError,
)
from libstore.message import Message, MessageConst, MessageRecord, MessageSysFlag
from libstore.message_id import UniqKeyGenerator, create_message_id, decode_message_id
from libstore.record_codec import DispatchRequest, decode_record
from libstore.recovery import RecoveryReport
from libstore.results import AppendMessageStatus, PutMessageResult, PutMessageResults, PutMessageStatus
from libstore.topic_config import TopicConfig, TopicConfigManager, TopicMessageType

__all__ = [
    "AppendMessageStatus",
    "AppendResult",
    "BrokerRole",
    "CommitLog",
    "ConfigError",
    "CorruptRecordError",
    "DiskFullError",
    "DispatchRequest",
    "FlushDiskType",
    "IllegalTopicError",
    "InvalidArgumentError",
    "Message",
    "MessageConst",
    "MessageIllegalError",
    "MessageRecord",
    "MessageSysFlag",
    "NotMasterError",
    "OSPageCacheBusyError",
    "OffsetOutOfRangeError",
    "PropertiesSizeExceededError",
    "PutMessageResult",
    "PutMessageResults",
    "PutMessageStatus",
    "QueueIdOutOfRangeError",
    "RecoveryReport",
    "ServiceNotAvailableError",
    "StoreConfig",
    "StoreError",
    "StoreIOError",
    "StoreLockedError",
    "TopicConfig",
    "TopicConfigManager",
    "TopicMessageType",
    "TopicNotFoundError",
    "UniqKeyGenerator",
    "create_message_id",
    "decode_message_id",
    "decode_record",
]
