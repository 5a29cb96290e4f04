"""Continuous batching of token streams over a fixed set of batch rows, knowing nothing of any model.

An engine (`RowEngine`) owns the device state of `max_rows` rows; the scheduler decides which
request lives in which row and when the engine runs:
- `submit(request)` queues a request (bounded: `QueueFullError` when `max_queue` wait already) and
  returns a `StreamHandle` (an iterator of token lists, a callback, `result()`, `cancel()`);
- each `pump()` is one round: it frees rows of cancelled streams, admits every queued request that
  has a free row in one `admit_rows` call (the engine prefills those rows together; other rows' state
  is untouched), runs up to `stop_check_interval` steps of every row together (fewer when no row can
  take more: the engine says how many steps each row may still take), then takes a `snapshot` of the
  rows (an asynchronous device -> host copy, no wait) and `collect`s snapshots `poll_lag` rounds old:
  new tokens go out to their handles, finished rows leave and their row is free for the next round.
  With poll_lag 1 the host reads round k while the device runs round k+1 (the host never waits for an
  empty device queue); a finished row then rides along, unchanged, one round longer. A round that
  steps nothing collects every snapshot left.
- Rows are handed out lowest index first, so the batch bucket of a step is the smallest engine
  bucket >= (highest row that may still step + 1); a freed low row is refilled before the batch grows.

Threads: `submit` and `cancel` may be called from any thread; `pump` from one thread at a time (the
GPU worker: `start()` runs it in a daemon thread until `stop()`, or a caller pumps by hand).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from voicehub.errors import VoiceHubError
from voicehub.runtime.kv_cache import pick_bucket
from voicehub.runtime.round_loop import RoundLoop

log = logging.getLogger("voicehub.runtime.scheduler")


class QueueFullError(VoiceHubError, RuntimeError):
    """The scheduler already holds max_queue waiting requests."""


class StreamCancelledError(VoiceHubError, RuntimeError):
    """result() of a stream that was cancelled before it finished."""


@dataclass
class RowUpdate:
    """What one snapshot held for a row: tokens sampled since the previous one, whether it finished,
    and (when finished) the engine's final result for it."""

    tokens: list[int]
    is_done: bool
    result: Any = None


class RowEngine(Protocol):
    """Device state of max_rows rows that step together."""

    max_rows: int
    row_buckets: tuple[int, ...]  # batch sizes a step may run at (sorted, max_rows last)
    stop_check_interval: int  # most steps between two snapshots

    def check(self, request: Any) -> None:
        """Raise ValueError (naming the fix) if the request can never run on this engine."""

    def admit_rows(self, rows: list[int], requests: list[Any]) -> None:
        """Prefill each request into its free row (touching no other row) and draw its first token."""

    def steps_left(self, row: int) -> int:
        """The most steps a busy row may still take (0: done for sure, only waiting to be collected)."""

    def step(self, n_rows: int) -> None:
        """Advance every live row in [0, n_rows) by one token; rows not live must stay unchanged."""

    def step_round(self, n_rows: int, n_steps: int) -> None:
        """`step` n_steps times (an engine may run them as one unit, e.g. one graph replay)."""

    def snapshot(self, rows: list[int]) -> Any:
        """Start copying the state of `rows` to the host (no wait); `collect` reads it."""

    def collect(self, snapshot: Any) -> dict[int, RowUpdate]:
        """Wait for a snapshot: new tokens, finished flags and final results of the rows it holds that
        are still held by the request they held when it was taken."""

    def release(self, row: int) -> None:
        """Free a row (finished or cancelled): it stops consuming work and holds no request state."""


_DONE = object()  # end-of-stream marker in a handle's token queue


@dataclass(eq=False)
class StreamHandle:
    """One submitted request. Iterate `tokens()` for token lists as they arrive, or pass
    `on_tokens` to `submit`; `result()` waits for the engine's final result."""

    request: Any
    on_tokens: Callable[[list[int]], None] | None = None
    _queue: queue.Queue = field(default_factory=queue.Queue, repr=False)
    _finished: threading.Event = field(default_factory=threading.Event, repr=False)
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False)
    _result: Any = None
    _error: BaseException | None = None
    n_tokens: int = 0

    def cancel(self) -> None:
        """Ask for the stream to stop; its row is freed at the scheduler's next pump."""
        self._cancel.set()

    @property
    def is_cancelled(self) -> bool:
        return self._cancel.is_set()

    @property
    def is_finished(self) -> bool:
        return self._finished.is_set()

    def tokens(self, timeout: float | None = None) -> Iterator[list[int]]:
        """Token lists in order until the stream ends (finished, cancelled or failed)."""
        while True:
            item = self._queue.get(timeout=timeout)
            if item is _DONE:
                return
            yield item

    def result(self, timeout: float | None = None) -> Any:
        """The engine's result; raises StreamCancelledError if cancelled, or the engine's error."""
        if not self._finished.wait(timeout):
            raise TimeoutError(f"stream not finished within {timeout} s")
        if self._error is not None:
            raise self._error
        return self._result

    def _emit(self, tokens: list[int]) -> None:
        if tokens:
            self.n_tokens += len(tokens)
            self._queue.put(tokens)
            if self.on_tokens is not None:
                self.on_tokens(tokens)

    def _finish(self, result: Any = None, error: BaseException | None = None) -> None:
        self._result, self._error = result, error
        self._finished.set()
        self._queue.put(_DONE)


class ContinuousScheduler:
    """Admits requests into the rows of `engine` as rows free up; see the module docstring.
    poll_lag: rounds a snapshot waits before it is read (0: at the end of its own round)."""

    def __init__(self, engine: RowEngine, max_queue: int = 64, poll_lag: int = 0):
        if max_queue < 0 or poll_lag < 0:
            raise ValueError(f"max_queue and poll_lag must be >= 0, got {max_queue}, {poll_lag}")
        self.engine, self.max_queue, self.poll_lag = engine, max_queue, poll_lag
        self._lock = threading.Lock()
        self._waiting: deque[StreamHandle] = deque()
        self._rows: dict[int, StreamHandle] = {}  # busy row -> its stream (touched by pump only)
        # snapshots not read yet, each with the rows' streams when it was taken
        self._pending: deque[tuple[Any, dict[int, StreamHandle]]] = deque()
        self._loop = RoundLoop(self.pump, "voicehub-scheduler")
        self.n_steps = 0  # steps run so far (all rows together)
        self.n_rounds = 0  # pumps that stepped

    def submit(self, request: Any, on_tokens: Callable[[list[int]], None] | None = None) -> StreamHandle:
        """Queue a request; raises QueueFullError when max_queue requests already wait (backpressure:
        the caller retries later or answers busy), ValueError if the engine can never run it."""
        self.engine.check(request)
        handle = StreamHandle(request, on_tokens)
        with self._lock:
            if len(self._waiting) >= self.max_queue:
                raise QueueFullError(
                    f"{len(self._waiting)} requests already wait for one of {self.engine.max_rows} rows; "
                    "retry later, or raise max_queue / the engine's max rows"
                )
            self._waiting.append(handle)
        self._loop.wake()
        return handle

    @property
    def n_active(self) -> int:
        return len(self._rows)

    @property
    def n_waiting(self) -> int:
        with self._lock:
            return len(self._waiting)

    @property
    def is_idle(self) -> bool:
        return not self._rows and self.n_waiting == 0

    def pump(self) -> bool:
        """One round: free cancelled rows, admit, step, snapshot, collect what is poll_lag rounds old.
        Returns whether any stream is still active or waiting."""
        self._drop_cancelled()
        n_admitted = self._admit()
        try:
            n_stepped = self._step_round()
            if self._rows and (n_stepped or n_admitted):
                self._pending.append((self.engine.snapshot(sorted(self._rows)), dict(self._rows)))
            keep = self.poll_lag if n_stepped else 0  # nothing runs meanwhile: read everything now
            while len(self._pending) > keep:
                self._collect(*self._pending.popleft())
        except BaseException as error:  # every live stream learns of the engine failure
            self._pending.clear()
            failed, self._rows = self._rows, {}
            self._fail(failed, error)
            raise
        return not self.is_idle

    def run_until_idle(self, max_pumps: int = 1_000_000) -> None:
        """Pump until no stream is active or waiting (tests and batch jobs)."""
        self._loop.run_until_idle(max_pumps)

    def start(self) -> None:
        """Pump in a daemon thread (the GPU worker) until `stop()`; it sleeps while idle."""
        self._loop.start()

    def stop(self, timeout: float | None = None) -> None:
        self._loop.stop(timeout)

    def _drop_cancelled(self) -> None:
        for row, handle in list(self._rows.items()):
            if handle.is_cancelled:
                self.engine.release(row)
                del self._rows[row]
                handle._finish(error=StreamCancelledError("the stream was cancelled"))
        with self._lock:
            cancelled = [h for h in self._waiting if h.is_cancelled]
            for handle in cancelled:
                self._waiting.remove(handle)
        for handle in cancelled:
            handle._finish(error=StreamCancelledError("the stream was cancelled before it started"))

    def _admit(self) -> int:
        """Every waiting request that has a free row, lowest rows first (keeps the batch bucket small),
        admitted in one engine call. A request the engine refuses fails alone; a failure of the call
        itself fails the requests of that call."""
        if self.n_waiting == 0:
            return 0
        free = [r for r in range(self.engine.max_rows) if r not in self._rows]
        taken: list[StreamHandle] = []
        with self._lock:
            while self._waiting and len(taken) < len(free):
                taken.append(self._waiting.popleft())
        handles = []
        for handle in taken:
            try:
                self.engine.check(handle.request)
            except Exception as error:
                handle._finish(error=error)
                continue
            handles.append(handle)
        rows = free[: len(handles)]
        if not rows:
            return 0
        try:
            self.engine.admit_rows(rows, [h.request for h in handles])
        except Exception as error:  # the rows stay free
            self._fail(dict(zip(rows, handles)), error)
            return 0
        self._rows.update(zip(rows, handles))
        return len(rows)

    def _fail(self, streams: dict[int, StreamHandle], error: BaseException) -> None:
        """Finish each stream with the engine's error, then free its row: a release that fails too must
        not leave a client waiting (it is logged; the engine's first error is the one raised)."""
        for handle in streams.values():
            handle._finish(error=error)
        for row in streams:
            try:
                self.engine.release(row)
            except Exception:
                log.exception("releasing row %d after the engine failed", row)

    def _step_round(self) -> int:
        """Up to stop_check_interval steps over the rows that may still step; returns how many ran."""
        left = [(row, self.engine.steps_left(row)) for row in self._rows]
        stepping = [(row, n) for row, n in left if n > 0]
        if not stepping:
            return 0
        n_rows = pick_bucket(max(row for row, _ in stepping) + 1, self.engine.row_buckets)
        n_steps = min(self.engine.stop_check_interval, max(n for _, n in stepping))
        self.engine.step_round(n_rows, n_steps)
        self.n_steps += n_steps
        self.n_rounds += 1
        return n_steps

    def _collect(self, snapshot: Any, owners: dict[int, StreamHandle]) -> None:
        for row, update in self.engine.collect(snapshot).items():
            handle = owners[row]
            if self._rows.get(row) is not handle:  # cancelled since the snapshot was taken
                continue
            handle._emit(update.tokens)
            if update.is_done:
                self.engine.release(row)
                del self._rows[row]
                handle._finish(update.result)
