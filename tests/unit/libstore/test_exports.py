"""libstore's public surface is small and deliberate: this list changes only on purpose."""

import libstore

EXPECTED = {
    "BoundaryType",
    "ConsumeQueue",
    "CqUnit",
    "GetMessageResult",
    "GetMessageStatus",
    "IndexService",
    "QueueProgress",
    "TagFilter",
    "ConsumerOffsetManager",
    "AppendMessageStatus",
    "AppendResult",
    "BrokerRole",
    "CommitLog",
    "AuthenticationError",
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
    "MessageNotFoundError",
    "MessageRecord",
    "MessageSysFlag",
    "NotMasterError",
    "LogDivergedError",
    "RoleSwitchError",
    "OSPageCacheBusyError",
    "OffsetOutOfRangeError",
    "PermissionDeniedError",
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
}


def test_all_is_pinned():
    assert set(libstore.__all__) == EXPECTED
    for name in EXPECTED:
        assert getattr(libstore, name) is not None


def test_every_error_is_a_store_error():
    for name in EXPECTED:
        obj = getattr(libstore, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, libstore.StoreError), name
