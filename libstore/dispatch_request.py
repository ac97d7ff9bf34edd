"""DispatchRequest: what reading one CommitLog record tells dispatch (RocketMQ's
``DispatchRequest``): where the record is, its queue and queue offset, and the properties the
ConsumeQueue, the IndexFile and the timer need. libstore.record_codec builds them
(check_record, in C when libstore._codec is built); libstore.dispatch hands them to the
CommitLogDispatchers.
"""

from __future__ import annotations


class DispatchRequest:
    """What a scan learns from one record (RocketMQ ``DispatchRequest``).

    ``success`` False means the bytes at the position are not a valid record; ``msg_size`` is then
    the TOTALSIZE read (or -1). A blank end-of-file record is ``success`` True with ``msg_size`` 0.
    When properties are decoded: ``tags`` is the TAGS property, ``tags_code`` its hash (spec §3),
    ``keys`` the KEYS property split on spaces (a tuple), ``uniq_key`` the UNIQ_KEY property,
    ``scheduled`` whether a delay or timer property is present (libstore.scheduled_message) and
    ``trace_context`` the producer's W3C ``traceparent`` property (what dispatch and index spans
    link to); otherwise they are None, 0, (), None, False and None.
    """

    __slots__ = (
        "born_timestamp",
        "commit_log_offset",
        "consume_queue_offset",
        "keys",
        "msg_size",
        "prepared_transaction_offset",
        "queue_id",
        "scheduled",
        "store_timestamp",
        "success",
        "sys_flag",
        "tags",
        "tags_code",
        "topic",
        "trace_context",
        "uniq_key",
    )

    def __init__(
        self,
        success: bool,
        msg_size: int,
        topic: str = "",
        queue_id: int = 0,
        commit_log_offset: int = -1,
        consume_queue_offset: int = 0,
        sys_flag: int = 0,
        born_timestamp: int = 0,
        store_timestamp: int = 0,
        prepared_transaction_offset: int = 0,
        tags: str | None = None,
        tags_code: int = 0,
        keys: tuple[str, ...] = (),
        uniq_key: str | None = None,
        scheduled: bool = False,
        trace_context: str | None = None,
    ) -> None:
        self.success = success
        self.msg_size = msg_size
        self.topic = topic
        self.queue_id = queue_id
        self.commit_log_offset = commit_log_offset
        self.consume_queue_offset = consume_queue_offset
        self.sys_flag = sys_flag
        self.born_timestamp = born_timestamp
        self.store_timestamp = store_timestamp
        self.prepared_transaction_offset = prepared_transaction_offset
        self.tags = tags
        self.tags_code = tags_code
        # A tuple, () when none: strings in a tuple leave the garbage collector's young
        # generation, where a list per record (tens of thousands held by the decoded-batch
        # cache) made each young collection of the server take ~20 ms.
        self.keys = keys
        self.uniq_key = uniq_key
        self.scheduled = scheduled
        self.trace_context = trace_context

    @property
    def is_blank(self) -> bool:
        return self.success and self.msg_size == 0

    @property
    def next_offset(self) -> int:
        return self.commit_log_offset + self.msg_size

    def __repr__(self) -> str:
        if not self.success:
            return f"DispatchRequest(invalid, size={self.msg_size})"
        if self.msg_size == 0:
            return "DispatchRequest(blank)"
        return (
            f"DispatchRequest(topic={self.topic!r}, queue_id={self.queue_id}, "
            f"phy_offset={self.commit_log_offset}, size={self.msg_size}, "
            f"queue_offset={self.consume_queue_offset})"
        )
