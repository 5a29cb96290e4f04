import pytest
import torch

from voicehub.runtime.cuda_graphs import BucketedGraphRunner, GraphPreset, parse_graph_preset, pick_bucket


def test_pick_bucket_takes_the_smallest_that_fits():
    assert pick_bucket([128, 256, 512], 1) == 128
    assert pick_bucket([128, 256, 512], 129) == 256
    assert pick_bucket([128, 256, 512], 512) == 512
    assert pick_bucket([128, 256, 512], 513) is None


def test_unknown_preset_lists_valid_ones():
    with pytest.raises(ValueError, match="full, minimal, lazy, off"):
        parse_graph_preset("always")
    assert parse_graph_preset("lazy") is GraphPreset.LAZY


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
