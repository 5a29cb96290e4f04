import pytest
import torch

from voicehub.runtime.cuda_graphs import BucketedGraphRunner, GraphPreset, capturing, parse_graph_preset
from voicehub.runtime.graph_presets import resolve_graph_preset


def test_unknown_preset_lists_valid_ones():
    with pytest.raises(ValueError, match="full, minimal, lazy, off"):
        parse_graph_preset("always")
    assert parse_graph_preset("lazy") is GraphPreset.LAZY


def test_a_load_naming_no_preset_gets_minimal_on_cuda_and_off_elsewhere():
    assert resolve_graph_preset(None, "cuda") is GraphPreset.MINIMAL
    assert resolve_graph_preset("auto", "cuda") is GraphPreset.MINIMAL
    assert resolve_graph_preset(None, "cpu") is GraphPreset.OFF
    assert resolve_graph_preset("auto", "mps") is GraphPreset.OFF
    assert resolve_graph_preset("full", "cuda") is GraphPreset.FULL  # a named preset is kept
    with pytest.raises(ValueError, match="valid presets: full, minimal, lazy, off, or auto"):
        resolve_graph_preset("fastest", "cuda")


def test_off_calls_the_step_eagerly_and_capture_presets_need_cuda():
    x = torch.arange(8.0)
    runner = BucketedGraphRunner(lambda b: x[:b] * 2, [4, 8], "off", torch.device("cpu"))
    runner.capture_at_load()
    assert runner.captured_buckets == []
    assert torch.equal(runner.run(4), torch.tensor([0.0, 2.0, 4.0, 6.0]))
    with pytest.raises(ValueError, match="needs a CUDA device"):
        BucketedGraphRunner(lambda b: x, [4], "full", torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["full", "minimal", "lazy"])
def test_replay_sees_new_inputs_and_matches_eager(preset):
    dev = torch.device("cuda")
    static_in = torch.zeros(16, device=dev)
    weight = torch.randn(16, 16, device=dev)

    def step(bucket):
        return (weight[:bucket, :bucket] @ static_in[:bucket]).relu()

    runner = BucketedGraphRunner(step, [8, 16], preset, dev, common_buckets=[8])
    runner.capture_at_load()
    expected_at_load = {"full": [8, 16], "minimal": [8], "lazy": []}[preset]
    assert runner.captured_buckets == expected_at_load
    for _ in range(3):
        static_in.copy_(torch.randn(16, device=dev))
        for bucket in (8, 16):
            out = runner.run(bucket).clone()
            torch.testing.assert_close(out, step(bucket))
    assert runner.captured_buckets == [8, 16]


@pytest.mark.gpu
def test_registered_generator_replays_draw_as_eager_calls_do():
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev)
    out = torch.zeros(4, device=dev)

    def step(bucket):
        return out.copy_(torch.rand(4, device=dev, generator=gen))

    runner = BucketedGraphRunner(step, ["draw"], "full", dev, generators=[gen])
    runner.capture_at_load()
    gen.manual_seed(11)
    replayed = [runner.run("draw").clone() for _ in range(3)]
    gen.manual_seed(11)
    eager = [torch.rand(4, device=dev, generator=gen) for _ in range(3)]
    for a, b in zip(replayed, eager):
        torch.testing.assert_close(a, b)
    assert not torch.equal(replayed[0], replayed[1])


@pytest.mark.gpu
def test_capture_keeps_the_allocator_cache_and_waits_for_the_current_stream():
    # torch.cuda.graph empties the allocator's cache before each capture; `capturing` keeps it (the
    # load's next warm-up reuses it) and orders the capture after the current stream's queued work
    dev = torch.device("cuda")
    x = torch.ones(1 << 20, device=dev)
    del x  # a cached block: reserved, not allocated
    reserved = torch.cuda.memory_reserved(dev)
    static_in = torch.full((256,), 2.0, device=dev)
    torch.cuda._sleep(50_000_000)  # queued work on the current stream before the input is written
    static_in.fill_(3.0)
    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream(dev)
    with capturing(graph, None, side):
        out = static_in * 2
    assert torch.cuda.memory_reserved(dev) >= reserved
    graph.replay()
    torch.testing.assert_close(out, torch.full((256,), 6.0, device=dev))
    static_in.fill_(5.0)
    graph.replay()
    torch.testing.assert_close(out, torch.full((256,), 10.0, device=dev))


@pytest.mark.gpu
def test_an_error_inside_a_capture_is_the_steps_and_the_runner_captures_again():
    dev = torch.device("cuda")
    static_in = torch.ones(8, device=dev)
    fail = [True]

    def step(bucket):
        if fail[0] and torch.cuda.is_current_stream_capturing():  # the eager warm-up succeeds
            raise ValueError("step failed inside the capture")
        return static_in * bucket

    runner = BucketedGraphRunner(step, [2], "lazy", dev)
    with pytest.raises(ValueError, match="step failed inside the capture"):
        runner.run(2)
    fail[0] = False
    torch.testing.assert_close(runner.run(2), torch.full((8,), 2.0, device=dev))
    assert runner.captured_buckets == [2]


def test_capture_at_load_keeps_keys_captured_on_first_use(monkeypatch):
    # a key captured before the load-time capture (a decode during a load-time optimization) is kept,
    # and the preset's other keys are still captured, each once
    captured: list = []
    monkeypatch.setattr(
        BucketedGraphRunner,
        "_capture",
        lambda self, key: captured.append(key) or self._graphs.setdefault(key, object()),
    )
    runner = BucketedGraphRunner(
        lambda key: None, [8, 16, 32], "off", torch.device("cpu"), common_buckets=[8, 16]
    )
    runner.preset = GraphPreset.MINIMAL  # nothing runs (no CUDA here): only the bookkeeping is under test
    runner._capture(16)
    runner.capture_at_load()
    assert captured == [16, 8]
    runner.preset = GraphPreset.FULL
    runner.capture_at_load()
    assert captured == [16, 8, 32]
