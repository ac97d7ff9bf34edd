"""In the embedded suite, dispatch and index take the records the commitlog validated on append
(already decoded) instead of decoding the log again. Their files must be exactly what a rebuild
from the log produces."""

from __future__ import annotations

from pathlib import Path

from services.client import Admin, OutgoingMessage, Producer
from tests.service.conftest import embedded_options
from tests.service.harness import InProcessSuites, rebuild_derived, wait_derived_caught_up


def test_decoded_dispatch_equals_a_rebuild_from_the_log(suites: InProcessSuites, tmp_path: Path):
    root = tmp_path / "data"
    options = embedded_options(
        root, mappedFileSizeConsumeQueue=20 * 500, maxIndexNum=3000, maxHashSlotNum=101
    )
    suite = suites.start(options)
    suites.wait_ready(suite)
    with Admin(suite.address) as admin:
        admin.create_topic("Same", 3)
    with Producer(suite.address) as producer:  # records: decoded on append
        for start in range(0, 4000, 250):
            batch = [
                OutgoingMessage("Same", b"s%d" % i, tags=f"t{i % 3}", keys=[f"k{i}", f"g{i % 11}"])
                for i in range(start, start + 250)
            ]
            assert producer.send_batch(batch).all_ok
    with Producer(suite.address, encode_records=False) as producer:  # messages: decoded from the log
        assert producer.send_batch(
            [OutgoingMessage("Same", b"m%d" % i, keys=[f"m{i}"]) for i in range(300)]
        ).all_ok
    wait_derived_caught_up(suite)
    suites.stop(suite)
    built, rebuilt = rebuild_derived(suites, options, root)
    assert len(built["index"]) > 1 and any(name.endswith("00000000000000010000") for name in built["cq"])
    assert rebuilt["cq"] == built["cq"], "ConsumeQueues differ from a rebuild"
    assert rebuilt["index"] == built["index"], "IndexFiles differ from a rebuild"
