"""A background thread that runs rounds of work until stopped, sleeping while there is none.

The continuous scheduler (`runtime/scheduler.py`) and the GPT-SoVITS stream engine
(`models/gpt_sovits/serving.py`) both own one: `round_fn()` does one round and says whether work is
left; `wake()` (called by `submit` and `cancel` from any thread) ends an idle sleep early.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

IDLE_WAIT_S = 0.05  # an idle loop also looks again after this long (catches a cancel of a waiting stream)


class RoundLoop:
    """round_fn: one round -> True while work is left. on_error: called with an exception a round
    raised, after which the loop goes on; None lets the exception end the thread."""

    def __init__(
        self,
        round_fn: Callable[[], bool],
        name: str,
        on_error: Callable[[Exception], None] | None = None,
    ):
        self.round_fn, self.name, self.on_error = round_fn, name, on_error
        self._thread: threading.Thread | None = None
        self._stop, self._wake = threading.Event(), threading.Event()

    def run_until_idle(self, max_rounds: int = 1_000_000) -> None:
        """Run rounds on this thread until none is left (tests and batch jobs)."""
        for _ in range(max_rounds):
            if not self.round_fn():
                return
        raise RuntimeError(f"{self.name} still busy after {max_rounds} rounds")

    def start(self) -> None:
        """Run rounds in a daemon thread until `stop()`."""
        if self._thread is not None:
            raise RuntimeError(f"{self.name} already started")
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def wake(self) -> None:
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            try:
                busy = self.round_fn()
            except Exception as error:
                if self.on_error is None:
                    raise
                self.on_error(error)
                busy = False
            if not busy:
                self._wake.wait(IDLE_WAIT_S)
