"""Who may be elected (services.commitlog.election.electable) and how a group's keys read back
(parse_view): the rules the process tests exercise end to end, case by case."""

from __future__ import annotations

import json

from services.commitlog.election import GroupView, LeaderInfo, MemberInfo, electable, parse_view
from services.commitlog.etcd import KeyValue

PREFIX = b"/mqstore/broker-a/"


def member(broker_id: int, epoch: int, max_offset: int, synced: int, standby: bool = False) -> MemberInfo:
    return MemberInfo(broker_id, f"h:{broker_id}", f"h:{broker_id + 100}", epoch, max_offset, synced, standby)


def view(members: list[MemberInfo], sync_state: tuple[int, frozenset[int]] | None) -> GroupView:
    return GroupView(
        10, None, sync_state[0] if sync_state else 0, 5, sync_state, {m.broker_id: m for m in members}
    )


def ids(found: list[MemberInfo]) -> list[int]:
    return [m.broker_id for m in found]


def test_a_group_that_never_elected_takes_the_furthest_live_member() -> None:
    members = [member(0, 0, 100, 0), member(1, 0, 300, 0), member(2, 0, 300, 0)]
    assert ids(electable(view(members, None))) == [1, 2, 0]  # longest log, then lowest id


def test_only_caught_up_members_of_the_sync_state_set_and_its_master_are_electable() -> None:
    epoch = 2001  # begun by broker 1
    members = [
        member(0, 2001, 900, 2001),  # in the set, caught up with epoch 2001: electable
        member(1, 2001, 500, 0),  # the set's master, restarted (not synced): electable all the same
        member(2, 2001, 950, 0),  # in the set but restarted since: it may have lost what it acked
        member(3, 2001, 990, 2001),  # caught up once, but not in the set (it fell behind later)
        member(4, 1000, 999, 1000),  # in the set, synced with an older epoch only
    ]
    found = electable(view(members, (epoch, frozenset({0, 1, 2, 4}))))
    assert ids(found) == [0, 1]


def test_no_electable_member_means_none_unless_unclean() -> None:
    members = [member(0, 2001, 900, 0), member(2, 1000, 999, 0)]
    state = (2001, frozenset({1, 0}))
    assert electable(view(members, state)) == []
    assert ids(electable(view(members, state), unclean=True)) == [0, 2]  # newest epoch first


def test_a_member_an_operator_demoted_goes_last() -> None:
    members = [member(0, 1000, 100, 1000, standby=True), member(1, 1000, 100, 1000)]
    assert ids(electable(view(members, (1000, frozenset({0, 1}))))) == [1, 0]


def test_parse_view_reads_every_key_and_skips_malformed_ones() -> None:
    leader = LeaderInfo(1, "h:1", "h:101", "SYNC_MASTER", 2001)
    kvs = [
        KeyValue(PREFIX + b"leader", leader.to_json(), 7, 7, 0xABC),
        KeyValue(PREFIX + b"epoch", b"2001", 7, 7, 0),
        KeyValue(
            PREFIX + b"syncStateSet", json.dumps({"epoch": 2001, "brokerIds": [1, 0]}).encode(), 7, 9, 0
        ),
        KeyValue(PREFIX + b"members/0", member(0, 2001, 10, 2001).to_json(), 3, 8, 0x1),
        KeyValue(PREFIX + b"members/1", b"{not json", 3, 8, 0x2),
    ]
    parsed = parse_view(PREFIX, 9, kvs)
    assert parsed.leader == LeaderInfo(1, "h:1", "h:101", "SYNC_MASTER", 2001, 7, 0xABC)
    assert (parsed.epoch, parsed.epoch_mod) == (2001, 7)
    assert parsed.sync_state == (2001, frozenset({0, 1}))
    assert list(parsed.members) == [0] and parsed.members[0] == member(0, 2001, 10, 2001)


def test_an_unreadable_sync_state_set_names_nobody_rather_than_opening_a_first_election() -> None:
    kvs = [
        KeyValue(PREFIX + b"syncStateSet", b"{torn", 7, 9, 0),
        KeyValue(PREFIX + b"members/0", member(0, 2001, 10, 2001).to_json(), 3, 8, 0x1),
    ]
    parsed = parse_view(PREFIX, 9, kvs)
    assert parsed.sync_state == (0, frozenset())
    assert electable(parsed) == []  # not every live member, as for a group that never elected
