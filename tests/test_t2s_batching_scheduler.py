"""The model-agnostic scheduler against a scripted engine: which rows step, when the device is read."""

from __future__ import annotations

from voicehub.runtime.scheduler import ContinuousScheduler, RowUpdate


class ScriptedEngine:
    """Row r of a request `n` emits tokens 0..n-1, one per step; logs steps and polls."""

    max_rows, row_buckets, stop_check_interval = 8, (1, 2, 4, 8), 3

    def __init__(self):
        self.steps: list[int] = []  # n_rows of each step
        self.polls = 0
        self.left: dict[int, int] = {}
        self.made: dict[int, list[int]] = {}
        self.sent: dict[int, int] = {}

    def check(self, request: int) -> None:
        if request < 1:
            raise ValueError("a request is a positive token count")

    def admit(self, row: int, request: int) -> None:
        assert row not in self.left
        self.left[row], self.made[row], self.sent[row] = request - 1, [0], 0

    def step(self, n_rows: int) -> None:
        self.steps.append(n_rows)
        for row in self.left:
            if row < n_rows and self.left[row] > 0:
                self.made[row].append(len(self.made[row]))
                self.left[row] -= 1

    def poll(self, rows):
        self.polls += 1
        out = {}
        for r in rows:
            out[r] = RowUpdate(self.made[r][self.sent[r] :], self.left[r] == 0)
            self.sent[r] = len(self.made[r])
        return out

    def result(self, row: int) -> list[int]:
        return list(self.made[row])

    def release(self, row: int) -> None:
        self.left.pop(row, None)


def test_batch_bucket_follows_the_highest_busy_row_and_rows_are_reused_lowest_first():
    engine = ScriptedEngine()
    sched = ContinuousScheduler(engine)
    short, long_ = sched.submit(2), sched.submit(20)  # rows 0 and 1
    sched.pump()
    assert engine.steps == [2, 2, 2] and engine.polls == 1  # one device read per 3 steps
    assert short.result(timeout=0) == [0, 1] and sched.n_active == 1
    third = sched.submit(4)  # takes the freed row 0: the batch stays at 2 rows
    sched.pump()
    assert engine.steps[3:] == [2, 2, 2]
    more = [sched.submit(5) for _ in range(3)]  # rows 2, 3 and (after row 0 frees) ...
    sched.run_until_idle()
    assert 4 in engine.steps and max(engine.steps) == 4
    assert long_.result(timeout=0) == list(range(20)) and third.result(timeout=0) == list(range(4))
    assert all(h.result(timeout=0) == list(range(5)) for h in more)
    assert engine.polls * engine.stop_check_interval == len(engine.steps)


def test_tokens_arrive_in_order_per_stream_and_callbacks_see_them():
    engine = ScriptedEngine()
    sched = ContinuousScheduler(engine)
    seen: list[int] = []
    handle = sched.submit(10, on_tokens=seen.extend)
    sched.run_until_idle()
    chunks = list(handle.tokens(timeout=0))
    assert len(chunks) > 1 and [t for c in chunks for t in c] == seen == list(range(10))
