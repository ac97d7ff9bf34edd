"""How ``mqstore serve`` tunes its process (services._common.process_tuning): the youngest GC
generation is collected less often, and glibc keeps large reply buffers on the heap instead of
mapping fresh zero-filled pages for them."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

from services._common.process_tuning import YOUNG_GENERATION_THRESHOLD, tune_allocator, tune_young_collections


def test_only_the_young_threshold_changes() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        tune_young_collections()
        assert gc.get_threshold() == (YOUNG_GENERATION_THRESHOLD, 10, 10)
        assert YOUNG_GENERATION_THRESHOLD > 700
    finally:
        gc.set_threshold(*before)


_SERIALIZE_PULL_REPLIES = textwrap.dedent(
    """
    import os, resource, sys
    from services.proto import gateway_pb
    if sys.argv[1] == "tuned":
        from services._common.process_tuning import tune_allocator
        assert tune_allocator({})
    reply = gateway_pb.PullResponse()
    reply.records.extend(os.urandom(1135) for _ in range(230))  # a 256 KiB pull's worth
    reply.SerializeToString()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(100):
        reply.SerializeToString()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    """
)


def _page_faults(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", _SERIALIZE_PULL_REPLIES, mode], capture_output=True, text=True, check=True
    )
    return int(out.stdout)


def test_a_tuned_server_serializes_pull_replies_without_faulting_in_fresh_pages() -> None:
    # With glibc's defaults each 260 KB reply lands in a fresh mapping here: ~60 page faults
    # (pages the kernel zero-fills) per reply; tuned, the heap's blocks are reused.
    default, tuned = _page_faults("default"), _page_faults("tuned")
    assert default > 100 * 30
    assert tuned < default / 20


def test_thresholds_the_operator_set_through_glibc_are_left_alone() -> None:
    assert not tune_allocator({"MALLOC_MMAP_THRESHOLD_": "65536"})
    assert not tune_allocator({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1048576"})
