"""libstore: a RocketMQ-style message storage engine: CommitLog (flush, checkpoint, recovery),
ConsumeQueues and IndexFiles built by dispatch, pulls with long polling, consumer offsets.
``services.message_store.MessageStore`` wires them, through the services' own objects, into one
embedded store.

The public surface is listed in ``__all__`` and pinned by tests/unit/libstore/test_exports.py.
"""

from libstore.commit_log import AppendResult, CommitLog
from libstore.config import BrokerRole, FlushDiskType, StoreConfig
from libstore.consume_queue import BoundaryType, ConsumeQueue, CqUnit
from libstore.consumer_offset_manager import ConsumerOffsetManager, QueueProgress
from libstore.dispatch_request import DispatchRequest
from libstore.errors import (
    AuthenticationError,
    ConfigError,
    CorruptRecordError,
    DiskFullError,
    IllegalTopicError,
    InvalidArgumentError,
    LogDivergedError,
    MessageIllegalError,
    MessageNotFoundError,
    NotMasterError,
    OffsetOutOfRangeError,
    OSPageCacheBusyError,
    PermissionDeniedError,
    PropertiesSizeExceededError,
    QueueIdOutOfRangeError,
    RoleSwitchError,
    ServiceNotAvailableError,
    StoreError,
    StoreIOError,
    StoreLockedError,
    TopicNotFoundError,
)
from libstore.get_message import GetMessageResult
from libstore.index_service import IndexService
from libstore.message import Message, MessageConst, MessageRecord, MessageSysFlag
from libstore.message_filter import TagFilter
from libstore.message_id import UniqKeyGenerator, create_message_id, decode_message_id
from libstore.record_codec import decode_record
from libstore.recovery import RecoveryReport
from libstore.results import (
    AppendMessageStatus,
    GetMessageStatus,
    PutMessageResult,
    PutMessageResults,
    PutMessageStatus,
)
from libstore.topic_config import TopicConfig, TopicConfigManager, TopicMessageType

__all__ = [
    "AppendMessageStatus",
    "AppendResult",
    "AuthenticationError",
    "BoundaryType",
    "BrokerRole",
    "CommitLog",
    "ConfigError",
    "ConsumeQueue",
    "ConsumerOffsetManager",
    "CorruptRecordError",
    "CqUnit",
    "DiskFullError",
    "DispatchRequest",
    "FlushDiskType",
    "GetMessageResult",
    "GetMessageStatus",
    "IllegalTopicError",
    "IndexService",
    "InvalidArgumentError",
    "LogDivergedError",
    "Message",
    "MessageConst",
    "MessageIllegalError",
    "MessageNotFoundError",
    "MessageRecord",
    "MessageSysFlag",
    "NotMasterError",
    "OSPageCacheBusyError",
    "OffsetOutOfRangeError",
    "PermissionDeniedError",
    "PropertiesSizeExceededError",
    "PutMessageResult",
    "PutMessageResults",
    "PutMessageStatus",
    "QueueIdOutOfRangeError",
    "QueueProgress",
    "RecoveryReport",
    "RoleSwitchError",
    "ServiceNotAvailableError",
    "StoreConfig",
    "StoreError",
    "StoreIOError",
    "StoreLockedError",
    "TagFilter",
    "TopicConfig",
    "TopicConfigManager",
    "TopicMessageType",
    "TopicNotFoundError",
    "UniqKeyGenerator",
    "create_message_id",
    "decode_message_id",
    "decode_record",
]
