"""What watching costs: the wall time of a watch's ``with`` block and of the watch's own code inside it.

A watch's entry points (its forward hooks, its event handler, its optimiser hooks, its gradient hook) are marked
``@timed``; the watch's ``Stopwatch`` sums their calls while the block is open, and ``Report.cost`` states the two
times so that a user can see what share of the run the watch took. Only outermost calls count: a timed call made
inside another (the forward hook that the event handler runs for a fast path's call) is already inside that call's
time. A call after the block (a gradient hook that outlives it) counts nothing. Standard library only.
"""

from __future__ import annotations

import functools
import threading
import time


class _Nesting(threading.local):
    """Per thread: whether a timed entry point is running already (a nested call is inside its time)."""

    inside = False


class Stopwatch:
    """The watched block's wall time (``watched_seconds()``) and the timed calls' share of it (``own_seconds``)."""

    def __init__(self, clock=time.perf_counter):
        self.own_seconds = 0.0
        self._clock = clock
        self._closed_blocks_seconds = 0.0
        self._entered_at: float | None = None  # None: no block is open
        self._nesting = _Nesting()
        self._lock = threading.Lock()  # hooks may run on several threads (a DataLoader's, a gradient's)

    def start(self) -> None:
        """A ``with`` block opens: calls count from now."""
        self._entered_at = self._clock()

    def stop(self) -> None:
        """The block closes: its time is added to ``watched_seconds()``; calls count nothing until the next start."""
        if self._entered_at is not None:
            self._closed_blocks_seconds += self._clock() - self._entered_at
            self._entered_at = None

    def watched_seconds(self) -> float:
        """The wall time of every block so far, the open one up to now."""
        open_block = self._clock() - self._entered_at if self._entered_at is not None else 0.0
        return self._closed_blocks_seconds + open_block

    def run(self, call, *args, **kwargs):
        """``call(*args, **kwargs)``; its wall time is added to ``own_seconds`` when it is an outermost call in a block."""
        if self._nesting.inside or self._entered_at is None:
            return call(*args, **kwargs)
        self._nesting.inside, start = True, self._clock()
        try:
            return call(*args, **kwargs)
        finally:
            elapsed = self._clock() - start
            self._nesting.inside = False
            with self._lock:
                self.own_seconds += elapsed


def timed(entry_point):
    """Decorate a method of an object that has a ``stopwatch``: its calls count as that object's own time."""

    @functools.wraps(entry_point)
    def timed_entry_point(self, *args, **kwargs):
        return self.stopwatch.run(entry_point, self, *args, **kwargs)

    return timed_entry_point
