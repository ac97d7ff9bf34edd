"""How ``mqstore serve`` tunes its own process: the garbage collector and the C allocator.

Both are set once at start (services.serve.serve_forever) in the server's process. The
allocator setting is also offered to processes that consume (services.client.tune_allocator,
which ``mqstore consume`` and the benchmarks' consumers call); the client library never sets it
on its own, since it is the whole process's.

* The youngest generation is collected every YOUNG_GENERATION_THRESHOLD container allocations
  (net) instead of CPython's 700: a produced batch makes a few hundred short-lived objects per
  call (decoded requests, lists, futures), so at 700 the collector runs every other batch or
  so, finds them alive and promotes them, and the older generations' collections then walk
  what is already dead by refcount. Measured on the embedded suite (5 x 120,000 messages,
  batches of 256): 1,371 young collections and 785 ms of collecting at 700; 108 ms at 10,000.
* glibc serves a block of 128 KiB or more (its starting mmap threshold) with a fresh mapping
  and unmaps it when freed; the threshold rises after such a block is freed, and free memory
  at the heap's top goes back to the kernel past twice that (the trim threshold). A server
  allocates blocks of megabytes on every call (a PullMany reply of up to 4 MiB is serialized,
  copied into gRPC's buffers and freed), and whether they come from reused heap or from fresh
  pages, zero-filled by the kernel one page fault at a time, depends on what was freed before:
  the embedded suite under the consume benchmark took 1.45 page faults per message one run
  and 0.09 the next. The server keeps blocks below MMAP_THRESHOLD_BYTES on the heap and
  TRIM_THRESHOLD_BYTES of free heap before returning any (0.04-0.09 faults per message). A
  consumer frees as much per pull: the reply's bytes, every record in it and the records
  decoded from them, a few MB; untuned, its process took 0.11-0.25 page faults a message under
  the same benchmark, tuned 0.01-0.04, and spent 0.91x the CPU a message (8 interleaved rounds,
  200,000 messages over 16 queues: medians 4.68 against 5.14 µs, 206,000 against 180,000
  msgs/s). Left
  alone where the operator set either threshold through glibc's own environment variables
  (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_ or GLIBC_TUNABLES), and where the C library
  is not glibc.
"""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Mapping

from libstore._os import M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, mallopt

log = logging.getLogger(__name__)

YOUNG_GENERATION_THRESHOLD = 10_000
MMAP_THRESHOLD_BYTES = 16 * 1024 * 1024
TRIM_THRESHOLD_BYTES = 128 * 1024 * 1024
_OPERATOR_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def tune_young_collections() -> None:
    """Set the youngest generation's collection threshold to YOUNG_GENERATION_THRESHOLD,
    keeping CPython's thresholds for the older two."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_GENERATION_THRESHOLD, older, oldest)


def tune_allocator(environ: Mapping[str, str] = os.environ) -> bool:
    """Keep blocks below MMAP_THRESHOLD_BYTES on the heap and TRIM_THRESHOLD_BYTES of free heap
    (module docstring). Returns whether it did: False where the operator tuned malloc through
    ``environ`` or the C library has no mallopt."""
    if any(name in environ for name in _OPERATOR_SETTINGS) or "malloc" in environ.get("GLIBC_TUNABLES", ""):
        log.info("malloc thresholds left as the environment sets them")
        return False
    # The trim threshold first: setting either ends glibc's dynamic adjustment of both.
    return mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) and mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
