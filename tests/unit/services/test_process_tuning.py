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


_DECODE_PULLS = textwrap.dedent(
    """
    import os, resource, sys
    from libstore.message import Message
    from libstore.message_id import encode_host
    from libstore.record_codec import decode_records
    from libstore.record_encoder import RecordEncoder
    from services.proto import gateway_pb
    if sys.argv[1] == "tuned":
        from services.client import tune_allocator
        assert tune_allocator()
    encoder = RecordEncoder(encode_host("127.0.0.1", 10911), 4 * 1024 * 1024)
    raws = []
    for i in range(880):  # four queues' 256 KiB pulls, one PullMany reply
        batch = encoder.encode_batch([Message("T", os.urandom(1024), 0, tags="t")], 1)
        batch.patch(0, i, 1200 * i, 2)
        raws.append(bytes(batch.buf))
    wire = gateway_pb.PullManyResponse(
        results=[gateway_pb.PullResponse(queue_id=q, records=raws[q * 220 : (q + 1) * 220]) for q in range(4)]
    ).SerializeToString()
    def pull():
        reply = gateway_pb.PullManyResponse.FromString(bytes(bytearray(wire)))  # as grpc hands it over
        return [decode_records(list(result.records)) for result in reply.results]
    pull()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(30):
        records = pull()
        del records
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    """
)


def test_a_tuned_consumer_decodes_pulls_without_faulting_in_fresh_pages() -> None:
    """What PullConsumer does with each reply (parse it, decode its records, drop them): with
    glibc's defaults the freed megabytes went back to the kernel and each pull faulted them
    in again; services.client.tune_allocator keeps them."""

    def faults(mode: str) -> int:
        out = subprocess.run(
            [sys.executable, "-c", _DECODE_PULLS, mode], capture_output=True, text=True, check=True
        )
        return int(out.stdout)

    default, tuned = faults("default"), faults("tuned")
    assert default > 30 * 100  # a 1 MB reply is 250 pages
    assert tuned < default / 10
