"""QueueRoundRobin: where a message sent to queue -1 goes (the store picks its queue).

Round robin over its topic's write queues, one counter per topic: the counter numbers the
topic's messages placed so far (a count, not a queue id), and message ``n`` goes to queue
``n % write queue count``, so a topic whose queue count changes goes on from where it was.

The counters are the dict itself ({topic: next message number}). Called as ``choose(topic)``
(the Python encoders) it asks ``write_queue_nums`` for the queue count; the C encoder
(libstore._codec) reads and bumps a counter itself, with the queue count it already holds for
the topic, so placing a message runs no Python. Two batches placed at once on two threads may
give a number twice: their messages still spread over the queues, which is all a round robin
promises.
"""

from __future__ import annotations

from collections.abc import Callable


class QueueRoundRobin(dict[str, int]):
    """Round-robin queue choice per topic (module docstring); ``write_queue_nums(topic)`` gives
    a topic's write queue count and raises as a put to an unknown topic would."""

    def __init__(self, write_queue_nums: Callable[[str], int]) -> None:
        super().__init__()
        self._write_queue_nums = write_queue_nums

    def __call__(self, topic: str) -> int:
        """The queue id of ``topic``'s next message placed. Raises what ``write_queue_nums``
        raises (TopicNotFoundError...); the counter is not moved then."""
        width = self._write_queue_nums(topic)
        n = self.get(topic, 0)
        self[topic] = n + 1
        return n % width
