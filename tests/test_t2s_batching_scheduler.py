"""The model-agnostic scheduler against a scripted engine: which rows step, when the device is read."""

from __future__ import annotations

import pytest

from voicehub.runtime.scheduler import ContinuousScheduler, RowUpdate, StreamCancelledError


class ScriptedEngine:
    """Row r of a request `n` emits tokens 0..n-1, one per step (the first at admission); logs admissions,
    steps, snapshots and collects. A snapshot copies what was made so far; collect hands out its news."""

    max_rows, row_buckets, stop_check_interval = 8, (1, 2, 4, 8), 3

    def __init__(self):
        self.admissions: list[list[int]] = []  # rows of each admit_rows call
        self.steps: list[int] = []  # n_rows of each step
        self.snapshots = 0
        self.collects = 0
        self.left: dict[int, int] = {}
        self.made: dict[int, list[int]] = {}
        self.sent: dict[int, int] = {}
        self.generation: dict[int, int] = {}
        self._admitted = 0

    def check(self, request: int) -> None:
        if request < 1:
            raise ValueError("a request is a positive token count")

    def admit_rows(self, rows: list[int], requests: list[int]) -> None:
        self.admissions.append(list(rows))
        for row, request in zip(rows, requests):
            assert row not in self.left
            self._admitted += 1
            self.left[row], self.made[row], self.sent[row] = request - 1, [0], 0
            self.generation[row] = self._admitted

    def steps_left(self, row: int) -> int:
        return self.left[row]

    def step(self, n_rows: int) -> None:
        self.steps.append(n_rows)
        for row in self.left:
            if row < n_rows and self.left[row] > 0:
                self.made[row].append(len(self.made[row]))
                self.left[row] -= 1

    def step_round(self, n_rows: int, n_steps: int) -> None:
        for _ in range(n_steps):
            self.step(n_rows)

    def snapshot(self, rows):
        self.snapshots += 1
        return {r: (self.generation[r], len(self.made[r]), self.left[r] == 0) for r in rows}

    def collect(self, snap):
        self.collects += 1
        out = {}
        for r, (generation, n_made, is_done) in snap.items():
            if self.generation.get(r) != generation:
                continue
            out[r] = RowUpdate(
                self.made[r][self.sent[r] : n_made], is_done, list(self.made[r]) if is_done else None
            )
            self.sent[r] = n_made
        return out

    def release(self, row: int) -> None:
        self.left.pop(row, None)
        self.generation.pop(row, None)


def test_batch_bucket_follows_the_highest_busy_row_and_rows_are_reused_lowest_first():
    engine = ScriptedEngine()
    sched = ContinuousScheduler(engine)
    short, long_ = sched.submit(2), sched.submit(20)  # rows 0 and 1, admitted in one call
    sched.pump()
    assert engine.admissions == [[0, 1]]
    assert engine.steps == [2, 2, 2] and engine.collects == 1  # one device read per 3 steps
    assert short.result(timeout=0) == [0, 1] and sched.n_active == 1
    third = sched.submit(4)  # takes the freed row 0: the batch stays at 2 rows
    sched.pump()
    assert engine.steps[3:] == [2, 2, 2]
    more = [sched.submit(5) for _ in range(3)]  # rows 2, 3 and (after row 0 frees) ...
    sched.run_until_idle()
    assert 4 in engine.steps and max(engine.steps) == 4
    assert long_.result(timeout=0) == list(range(20)) and third.result(timeout=0) == list(range(4))
    assert all(h.result(timeout=0) == list(range(5)) for h in more)
    assert engine.collects == engine.snapshots == sched.n_rounds


def test_a_round_steps_no_more_than_the_rows_still_need():
    engine = ScriptedEngine()
    sched = ContinuousScheduler(engine)
    a, b = sched.submit(5), sched.submit(2)  # 4 and 1 steps left
    sched.pump()
    assert engine.steps == [2, 2, 2] and b.result(timeout=0) == [0, 1]
    sched.pump()  # row 0 needs one more step: one, at bucket 1
    assert engine.steps[3:] == [1] and a.result(timeout=0) == list(range(5))
    one = sched.submit(1)  # done at admission: no step at all
    sched.pump()
    assert engine.steps[4:] == [] and one.result(timeout=0) == [0] and sched.is_idle


def test_tokens_arrive_in_order_per_stream_and_callbacks_see_them():
    engine = ScriptedEngine()
    sched = ContinuousScheduler(engine)
    seen: list[int] = []
    handle = sched.submit(10, on_tokens=seen.extend)
    sched.run_until_idle()
    chunks = list(handle.tokens(timeout=0))
    assert len(chunks) > 1 and [t for c in chunks for t in c] == seen == list(range(10))


@pytest.mark.parametrize("poll_lag", [1, 2])
def test_lagged_reads_give_the_same_streams_a_round_late(poll_lag):
    sizes = [2, 20, 7, 4, 9, 5]
    runs = {}
    for lag in (0, poll_lag):
        engine = ScriptedEngine()
        sched = ContinuousScheduler(engine, poll_lag=lag)
        handles = [sched.submit(n) for n in sizes[:3]]
        sched.pump()
        if lag:  # the first round's snapshot is still unread
            assert engine.snapshots == 1 and engine.collects == 0 and not handles[0].is_finished
        handles += [sched.submit(n) for n in sizes[3:]]
        sched.run_until_idle()
        runs[lag] = [h.result(timeout=0) for h in handles], [list(h.tokens(timeout=0)) for h in handles]
        assert engine.collects == engine.snapshots and sched.is_idle
    assert runs[0][0] == runs[poll_lag][0] == [list(range(n)) for n in sizes]
    for chunks in runs[poll_lag][1]:
        assert chunks == [c for c in chunks if c]  # no empty emission


def test_a_row_cancelled_between_snapshot_and_read_gives_nothing_to_its_successor():
    engine = ScriptedEngine()
    sched = ContinuousScheduler(engine, poll_lag=1)
    gone, stays = sched.submit(30), sched.submit(30)
    sched.pump()  # snapshot 1 holds rows 0 and 1, unread
    gone.cancel()
    late = sched.submit(6)  # row 0 again, before snapshot 1 is read
    sched.run_until_idle()
    with pytest.raises(StreamCancelledError):
        gone.result(timeout=0)
    assert late.result(timeout=0) == list(range(6)) and stays.result(timeout=0) == list(range(30))
    assert [t for c in late.tokens(timeout=0) for t in c] == list(range(6))


def test_admission_is_one_call_and_a_refused_request_fails_alone():
    engine = ScriptedEngine()
    sched = ContinuousScheduler(engine)
    handles = [sched.submit(3) for _ in range(5)]
    handles[2].request = 0  # refused by check at admission (as if it changed after submit)
    sched.pump()
    assert engine.admissions == [[0, 1, 2, 3]]  # the four good ones, lowest rows, one call
    with pytest.raises(ValueError, match="positive"):
        handles[2].result(timeout=0)
    sched.run_until_idle()
    assert [handles[i].result(timeout=0) for i in (0, 1, 3, 4)] == [[0, 1, 2]] * 4


def test_an_engine_failure_at_admission_fails_that_call_only():
    class Failing(ScriptedEngine):
        def admit_rows(self, rows, requests):
            if 13 in requests:
                raise RuntimeError("device lost")
            super().admit_rows(rows, requests)

    engine = Failing()
    sched = ContinuousScheduler(engine)
    first = sched.submit(4)
    sched.pump()
    bad = [sched.submit(13), sched.submit(3)]
    sched.run_until_idle()
    assert first.result(timeout=0) == list(range(4))
    for handle in bad:
        with pytest.raises(RuntimeError, match="device lost"):
            handle.result(timeout=0)
    assert engine.left == {} and sched.is_idle


def test_a_step_failure_finishes_every_stream_even_if_releasing_fails_too(caplog):
    class Broken(ScriptedEngine):
        def step(self, n_rows):
            raise RuntimeError("device lost")

        def release(self, row):
            raise RuntimeError("release failed")

    sched = ContinuousScheduler(Broken())
    handles = [sched.submit(5) for _ in range(3)]
    with pytest.raises(RuntimeError, match="device lost"):
        sched.pump()
    for handle in handles:  # no client left waiting; the step's error, not the release's
        with pytest.raises(RuntimeError, match="device lost"):
            handle.result(timeout=0)
    assert sched.n_active == 0
    assert "releasing row 0 after the engine failed" in caplog.text
