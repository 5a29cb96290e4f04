import pytest
import torch

from voicehub.runtime.cuda_graphs import BucketedGraphRunner, GraphPreset, parse_graph_preset
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
def test_capture_follows_the_callers_work_and_keeps_the_allocators_cache():
    # no device-wide synchronize and cache emptying per capture (`torch.cuda.graph` does both): 256 MiB
    # freed before the capture stay reserved; the warm-ups and the capture still see what the caller
    # wrote just before on its stream, and the caller sees the step's output after
    dev = torch.device("cuda")
    big = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    del big
    reserved = torch.cuda.memory_reserved(dev)
    x = torch.zeros(1 << 22, device=dev)
    runner = BucketedGraphRunner(lambda bucket: x * 2 + 1, [1], "full", dev)
    x.fill_(3.0)
    runner.capture_at_load()
    assert torch.cuda.memory_reserved(dev) >= reserved
    assert torch.equal(runner.run(1), torch.full_like(x, 7.0))
    x.fill_(-1.0)
    assert torch.equal(runner.run(1), torch.full_like(x, -1.0))


@pytest.mark.gpu
def test_two_threads_capture_at_once_and_each_graph_replays_its_own_step():
    # as the load does (T2S graphs on its runtime thread, acoustic graphs on the main thread): two runners
    # capture several buckets each from two threads at the same time, one with a registered generator,
    # while each thread also runs eager work that reads back to the host; every graph replays its own step
    import threading
    import time

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(5)
    a_in, b_in = torch.arange(4096.0, device=dev), torch.ones(4096, device=dev)

    def step_a(bucket):
        y = a_in[:bucket]
        for _ in range(50):  # many launches spread over time, so the two captures overlap
            y = y * 1.0001 + 1.0
            time.sleep(0.0002)
        return y + torch.rand(bucket, device=dev, generator=gen) * 0

    def step_b(bucket):
        y = b_in[:bucket]
        for _ in range(50):
            y = y.sin() + 2.0
            time.sleep(0.0002)
        return y

    runners = {
        "a": BucketedGraphRunner(step_a, [256, 1024, 4096], "full", dev, generators=[gen]),
        "b": BucketedGraphRunner(step_b, [512, 2048, 4096], "full", dev),
    }
    errors = []

    def capture(name):
        try:
            runners[name].capture_at_load()
            torch.ones(8, device=dev).sum().item()  # eager work and a host read beside the other's capture
        except Exception as exc:  # pragma: no cover - reported by the assert below
            errors.append(f"{name}: {exc!r}")

    threads = [threading.Thread(target=capture, args=(name,)) for name in runners]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for name, step in (("a", step_a), ("b", step_b)):
        for bucket in runners[name].buckets:
            assert torch.allclose(runners[name].run(bucket), step(bucket), rtol=1e-6, atol=1e-5), (
                name,
                bucket,
            )


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
