"""Continuous batching of token streams over a fixed set of batch rows, knowing nothing of any model.

An engine (`RowEngine`) owns the device state of `max_rows` rows; the scheduler decides which
request lives in which row and when the engine runs:
- `submit(request)` queues a request (bounded: `QueueFullError` when `max_queue` wait already) and
  returns a `StreamHandle` (an iterator of token lists, a callback, `result()`, `cancel()`);
- each `pump()` first frees rows of cancelled streams, admits queued requests into free rows (the
  engine prefills that row only; other rows' state is untouched), then runs `stop_check_interval`
  steps of every row together, and only then reads the device once (`poll`): new tokens go out to
  their handles, finished rows leave and their row is free for the next `pump`.
- Rows are handed out lowest index first, so the batch bucket of a step is the smallest engine
  bucket >= (highest busy row + 1); a freed low row is refilled before the batch grows.

Threads: `submit` and `cancel` may be called from any thread; `pump` from one thread at a time (the
GPU worker: `start()` runs it in a daemon thread until `stop()`, or a caller pumps by hand).
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from voicehub.errors import VoiceHubError
from voicehub.runtime.kv_cache import pick_bucket
from voicehub.runtime.round_loop import RoundLoop


class QueueFullError(VoiceHubError, RuntimeError):
    """The scheduler already holds max_queue waiting requests."""


class StreamCancelledError(VoiceHubError, RuntimeError):
    """result() of a stream that was cancelled before it finished."""


@dataclass
class RowUpdate:
    """What one poll found for a row: tokens sampled since the last poll, and whether it finished."""

    tokens: list[int]
    is_done: bool


class RowEngine(Protocol):
    """Device state of max_rows rows that step together."""

    max_rows: int
    row_buckets: tuple[int, ...]  # batch sizes a step may run at (sorted, max_rows last)
    stop_check_interval: int  # steps between two host reads of the device state

    def check(self, request: Any) -> None:
        """Raise ValueError (naming the fix) if the request can never run on this engine."""

    def admit(self, row: int, request: Any) -> None:
        """Prefill `request` into free `row` (touching no other row) and draw its first token."""

    def step(self, n_rows: int) -> None:
        """Advance every live row in [0, n_rows) by one token; rows not live must stay unchanged."""

    def poll(self, rows: list[int]) -> dict[int, RowUpdate]:
        """One read of the device: new tokens and finished flags of `rows`."""

    def result(self, row: int) -> Any:
        """The final result of a finished row (before `release`)."""

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
    """Admits requests into the rows of `engine` as rows free up; see the module docstring."""

    def __init__(self, engine: RowEngine, max_queue: int = 64):
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        self.engine, self.max_queue = engine, max_queue
        self._lock = threading.Lock()
        self._waiting: deque[StreamHandle] = deque()
        self._rows: dict[int, StreamHandle] = {}  # busy row -> its stream (touched by pump only)
        self._loop = RoundLoop(self.pump, "voicehub-scheduler")
        self.n_steps = 0  # steps run so far (all rows together)

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
        """One round: free cancelled rows, admit, step `stop_check_interval` times, poll, emit.
        Returns whether any stream is still active or waiting."""
        self._drop_cancelled()
        self._admit()
        if self._rows:
            try:
                n_rows = pick_bucket(max(self._rows) + 1, self.engine.row_buckets)
                for _ in range(self.engine.stop_check_interval):
                    self.engine.step(n_rows)
                    self.n_steps += 1
                self._collect()
            except BaseException as error:  # every live stream learns of the engine failure
                for row in list(self._rows):
                    self._rows.pop(row)._finish(error=error)
                    self.engine.release(row)
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

    def _admit(self) -> None:
        free = [r for r in range(self.engine.max_rows) if r not in self._rows]
        for row in free:  # lowest rows first: keeps the batch bucket small
            with self._lock:
                if not self._waiting:
                    return
                handle = self._waiting.popleft()
            try:
                self.engine.admit(row, handle.request)
            except Exception as error:  # a bad request fails alone; the row stays free
                self.engine.release(row)
                handle._finish(error=error)
                continue
            self._rows[row] = handle

    def _collect(self) -> None:
        updates = self.engine.poll(sorted(self._rows))
        for row, update in updates.items():
            handle = self._rows[row]
            handle._emit(update.tokens)
            if update.is_done:
                result = self.engine.result(row)
                self.engine.release(row)
                del self._rows[row]
                handle._finish(result)
