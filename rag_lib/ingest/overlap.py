"""A bounded pipeline of steps: each item goes through the steps in order, each step on its own
thread, so that while the encoder embeds one round of files the next round is read, parsed and
chunked and the previous one published. At most `in_flight` items are between their first step
and their last (what bounds memory), and the items come out in their order."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def overlapped(items: Iterable[T], steps: Sequence[Callable[[T], None]], in_flight: int,
               stop: Callable[[], None] | None = None) -> Iterator[T]:
    """Yield each of `items` once every step has run on it. A step runs on one item at a time, in
    the items' order, and starts on an item when the step before it has finished it. An exception
    in a step is raised here when its item's turn comes, that is after every earlier item went
    through every step (a failing round leaves the rounds before it complete); no step starts on a
    later item once it is raised (an outage is not met again by the next round). When the consumer
    stops early (an error, an interrupt, a `break`), `stop` is called before the steps already
    running are waited for, so they can stop between their own pieces of work (a Ctrl-C is not
    kept waiting for a whole round)."""
    if in_flight < 1:
        raise ValueError("in_flight must be at least 1")
    pools = [ThreadPoolExecutor(1, thread_name_prefix=f"ingest-step{i}") for i in range(len(steps))]
    first_failed = [float("inf")]  # the position of the first item a step failed on
    pending: deque[tuple[T, Future]] = deque()

    def run(position: int, previous: Future | None, step: Callable[[T], None], item: T) -> None:
        if previous is not None:
            previous.result()  # the item failed in an earlier step: this step fails with the same error
        if position > first_failed[0]:
            raise CancelledError(f"an earlier item failed at position {first_failed[0]}")
        try:
            step(item)
        except BaseException:
            first_failed[0] = min(first_failed[0], position)
            raise

    try:
        for position, item in enumerate(items):
            last: Future | None = None
            for pool, step in zip(pools, steps):
                last = pool.submit(run, position, last, step, item)
            pending.append((item, last))
            if len(pending) >= in_flight:
                done, future = pending.popleft()
                future.result()
                yield done
        while pending:
            done, future = pending.popleft()
            future.result()
            yield done
    except BaseException:  # GeneratorExit too: the consumer left before the last item
        if stop is not None:
            stop()
        raise
    finally:
        for pool in pools:  # on an error: steps already running finish, the others never start
            pool.shutdown(wait=True, cancel_futures=True)
