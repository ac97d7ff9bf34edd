"""The pull algorithm's unit selection (libstore.get_message) against a unit-by-unit reference.

select_units takes every unit of a chunk at once when nothing can be skipped (no tags-code
filter, no blank unit); these properties check that shortcut against the plain loop of the
module docstring (steps 1-3) over random queues, counts, byte bounds and filters.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from libstore.consume_queue import BLANK_UNIT_SIZE, UnitColumns
from libstore.get_message import MAX_FILTER_UNITS, UnitSelection, fetch_messages, select_units
from libstore.message_filter import ACCEPT_ALL, TagFilter
from libstore.results import GetMessageStatus
from libstore.tags import tags_code


def _reader(min_offset: int, units: list[tuple[int, int, int]]):
    """read_columns over ``units`` ((phy, size, code) for queue offsets min_offset...)."""

    def read_columns(queue_offset: int, count: int) -> UnitColumns:
        chunk = units[queue_offset - min_offset : queue_offset - min_offset + count]
        return UnitColumns(queue_offset, [u[0] for u in chunk], [u[1] for u in chunk], [u[2] for u in chunk])

    return read_columns


def _reference(
    offset: int,
    max_count: int,
    min_offset: int,
    units: list[tuple[int, int, int]],
    codes: frozenset[int] | None,
    max_bytes: int,
) -> tuple[int, list[int]]:
    """Steps 2-3 one unit at a time: (next offset, selected queue offsets)."""
    max_offset = min_offset + len(units)
    window = min(max(MAX_FILTER_UNITS, max_count), max_offset - offset)
    selected: list[int] = []
    total = 0
    next_offset = offset
    for queue_offset in range(offset, offset + window):
        _, size, code = units[queue_offset - min_offset]
        if len(selected) >= max_count or (selected and total + size > max_bytes):
            break
        next_offset = queue_offset + 1
        if size == BLANK_UNIT_SIZE or (codes is not None and code not in codes):
            continue
        selected.append(queue_offset)
        total += size
    return next_offset, selected


_TAGS = ["a", "b", "c"]


@st.composite
def _queues(draw: st.DrawFn) -> tuple[int, list[tuple[int, int, int]]]:
    min_offset = draw(st.integers(0, 50))
    n = draw(st.integers(1, 1200))
    blank_share = draw(st.sampled_from([0.0, 0.0, 0.05]))
    rnd = draw(st.randoms(use_true_random=False))
    units = []
    phy = 4096
    for _ in range(n):
        if rnd.random() < blank_share:
            units.append((0, BLANK_UNIT_SIZE, 0))
            continue
        # mostly real sizes; now and then what only a damaged unit holds (the byte bound's
        # bisection needs growing totals, so such a chunk takes the unit-by-unit path)
        size = rnd.choice([200, 1135, 1135, 4000, 70_000] * 20 + [0, -5])
        units.append((phy, size, tags_code(rnd.choice(_TAGS))))
        phy += size
    return min_offset, units


@settings(max_examples=300, deadline=None)
@given(
    queue=_queues(),
    start=st.integers(0, 1300),
    max_count=st.integers(1, 600),
    max_bytes=st.sampled_from([1, 2000, 64 * 1024, 256 * 1024, 1 << 30]),
    exact_after=st.one_of(st.none(), st.integers(1, 40)),
    expression=st.sampled_from(["*", "a", "a || c", "z"]),
)
def test_selection_matches_the_unit_by_unit_loop(queue, start, max_count, max_bytes, exact_after, expression):
    min_offset, units = queue
    max_offset = min_offset + len(units)
    offset = min_offset + start % len(units)
    if exact_after is not None:  # the bound falls exactly on a unit's end: taken, the next one not
        sizes = [u[1] for u in units[offset - min_offset :] if u[1] != BLANK_UNIT_SIZE]
        max_bytes = max(1, sum(sizes[:exact_after]))
    filt = TagFilter(expression)
    sel = select_units(offset, max_count, min_offset, max_offset, _reader(min_offset, units), filt, max_bytes)
    next_offset, selected = _reference(offset, max_count, min_offset, units, filt.codes, max_bytes)
    assert sel.status is None
    assert (sel.next_offset, sel.queue_offsets) == (next_offset, selected)
    assert sel.phy_offsets == [units[q - min_offset][0] for q in selected]
    assert sel.sizes == [units[q - min_offset][1] for q in selected]
    assert sel.ranges() == list(zip(sel.phy_offsets, sel.sizes, strict=True))


def test_a_first_unit_larger_than_max_bytes_is_still_returned_alone():
    units = [(100, 5000, 0), (5100, 10, 0)]
    sel = select_units(0, 32, 0, 2, _reader(0, units), ACCEPT_ALL, max_bytes=1000)
    assert (sel.queue_offsets, sel.next_offset) == ([0], 1)


def test_offsets_outside_the_queue_get_statuses_without_reading():
    def never(_offset: int, _count: int) -> UnitColumns:
        raise AssertionError("read outside the queue")

    assert select_units(0, 8, 0, 0, never).status is GetMessageStatus.NO_MESSAGE_IN_QUEUE
    assert select_units(3, 8, 5, 9, never).status is GetMessageStatus.OFFSET_TOO_SMALL
    assert select_units(9, 8, 5, 9, never).status is GetMessageStatus.OFFSET_OVERFLOW_ONE


def test_fetch_keeps_the_columns_and_counts_records_the_log_no_longer_holds():
    sel = UnitSelection(None, 13, 0, 20, [10, 11, 12], [100, 200, 300], [5, 5, 5])
    whole = fetch_messages(sel, [b"r0", b"r1", b"r2"])
    assert (whole.status, whole.records, whole.queue_offsets, whole.phy_offsets) == (
        GetMessageStatus.FOUND,
        [b"r0", b"r1", b"r2"],
        [10, 11, 12],
        [100, 200, 300],
    )
    holed = fetch_messages(sel, [None, b"r1", None])
    assert (holed.records, holed.queue_offsets, holed.phy_offsets, holed.removed) == (
        [b"r1"],
        [11],
        [200],
        2,
    )
    gone = fetch_messages(sel, [None, None, None])
    assert gone.status is GetMessageStatus.MESSAGE_WAS_REMOVING and gone.removed == 3


def test_a_damaged_unit_size_does_not_confuse_the_byte_bound():
    # A negative size (only a damaged unit holds one) makes the running total fall: the whole-
    # chunk shortcut bisects that total, so such a chunk must go unit by unit and stop where
    # the bound is first passed.
    units = [(100, 1000, 0), (1100, 1000, 0), (2100, -1900, 0), (2200, 200, 0)]
    sel = select_units(0, 32, 0, 4, _reader(0, units), ACCEPT_ALL, max_bytes=1500)
    assert (sel.queue_offsets, sel.next_offset) == ([0], 1)
