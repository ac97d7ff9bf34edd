"""PutMessageResults: column-held batch results that behave as a sequence of PutMessageResult."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libstore import PutMessageResult, PutMessageResults, PutMessageStatus
from libstore.message_id import create_message_id, encode_host

HOST = encode_host("10.0.0.7", 10911)


def _results() -> PutMessageResults:
    # 3 messages asked for, 2 appended (at 100 and 180), the third found no segment.
    return PutMessageResults(
        3,
        phy_offsets=[100, 180],
        sizes=[80, 90, 70],
        queue_offsets=[5, 0],
        store_timestamp=1_700_000_000_123,
        store_host=HOST,
        failed_status=PutMessageStatus.CREATE_MAPPED_FILE_FAILED,
    )


def test_items_are_materialized_from_the_columns():
    res = _results()
    assert len(res) == 3 and res.appended == 2 and not res.all_ok
    first, second, third = res
    assert (first.status, first.phy_offset, first.size, first.queue_offset) == (
        PutMessageStatus.PUT_OK,
        100,
        80,
        5,
    )
    assert first.msg_id == create_message_id(HOST, 100) and first.store_timestamp == 1_700_000_000_123
    assert (second.phy_offset, second.next_offset) == (180, 270)
    assert third.status is PutMessageStatus.CREATE_MAPPED_FILE_FAILED and third.phy_offset == -1
    assert third.msg_id == "" and not third.status.appended
    assert res.next_offset == 270
    assert res[-1].status is PutMessageStatus.CREATE_MAPPED_FILE_FAILED
    assert [r.phy_offset for r in res[:2]] == [100, 180]
    with pytest.raises(IndexError):
        res[3]


def test_a_flush_outcome_overrides_the_appended_messages_only():
    res = _results()
    res.status = PutMessageStatus.FLUSH_DISK_TIMEOUT
    assert [r.status for r in res] == [
        PutMessageStatus.FLUSH_DISK_TIMEOUT,
        PutMessageStatus.FLUSH_DISK_TIMEOUT,
        PutMessageStatus.CREATE_MAPPED_FILE_FAILED,
    ]


def test_equality_with_lists_of_results():
    assert PutMessageResults(0) == [] and PutMessageResults(0).next_offset == -1
    res = _results()
    same = [
        PutMessageResult(PutMessageStatus.PUT_OK, 100, 80, 5),
        PutMessageResult(PutMessageStatus.PUT_OK, 180, 90, 0),
        PutMessageResult(PutMessageStatus.CREATE_MAPPED_FILE_FAILED),
    ]
    assert res == same
    same[1] = PutMessageResult(PutMessageStatus.PUT_OK, 180, 90, 1)
    assert res != same


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=5000), min_size=1, max_size=30),
    data=st.data(),
)
def test_durable_end_of_an_append_in_log_order_is_the_general_answer(
    sizes: list[int], data: st.DataObject
) -> None:
    """One append under the lock gives ascending offsets; its shortcut (the last waiting record
    ends furthest) answers as the general rule (the furthest end of the waiting records)."""
    phys = [sum(sizes[:i]) + 4096 for i in range(len(sizes))]
    appended = data.draw(st.integers(min_value=0, max_value=len(sizes)))
    unwaited = frozenset(data.draw(st.sets(st.integers(min_value=0, max_value=len(sizes) - 1))))

    def results(in_order: bool) -> PutMessageResults:
        return PutMessageResults(
            len(sizes),
            phy_offsets=phys[:appended],
            sizes=sizes,
            queue_offsets=list(range(appended)),
            unwaited=unwaited,
            in_log_order=in_order,
        )

    waiting_ends = [phys[i] + sizes[i] for i in range(appended) if i not in unwaited]
    expected = max(waiting_ends) if waiting_ends else None
    assert results(True).durable_end() == expected
    assert results(False).durable_end() == expected
