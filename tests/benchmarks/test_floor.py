"""The physical floor of a workload (benchmarks/floor.py), computed by hand for a tiny one."""

from __future__ import annotations

import pytest

from benchmarks import throughput_report as report
from benchmarks.floor import kv_bytes_per_position, physical_floor
from benchmarks.workloads import BenchRequest, model_shape


def test_floor_by_hand() -> None:
    shape = model_shape()
    reqs = [BenchRequest([5] * 10, 3), BenchRequest([5] * 4, 1)]
    gflops, gbps = 100.0, 10.0
    f = physical_floor(reqs, shape, gflops, gbps)
    assert f.decode_steps == 2  # the longest request decodes 2 tokens after its first
    # The last layer past its K/V (q, o, gate, up, down) runs for each prompt's last token
    # alone: the others' hidden states feed nothing but that layer's K and V.
    h, i = shape.hidden_size, shape.intermediate_size
    skip = 2 * h * h + 3 * h * i
    assert shape.last_layer_unsampled_skip == skip
    prefill = 0.0
    for n in (10, 4):
        prefill += 2 * shape.params_in_linear_layers * n + 2 * shape.lm_head_params
        prefill -= 2 * skip * (n - 1)
        prefill += 4 * h * (shape.num_hidden_layers - 1) * n * (n + 1) / 2  # causal, all rows
        prefill += 4 * h * n  # the last layer: the last token's n keys
    assert f.prefill_s == pytest.approx(prefill / (gflops * 1e9))
    weights = 4 * (shape.params_in_linear_layers + shape.lm_head_params)
    assert f.decode_weights_s == pytest.approx(2 * weights / (gbps * 1e9))
    # only the first request decodes: at positions 10 and 11, reading 11 and 12 positions
    assert f.decode_kv_s == pytest.approx((11 + 12) * kv_bytes_per_position(shape) / 1e10)
    assert f.total_s == pytest.approx(f.prefill_s + f.decode_s)


def test_workload_flops_count_the_last_layer_for_sampled_rows() -> None:
    """The workload's least matmul work: a prompt's tokens but its last skip the last layer past
    its K/V and that layer's attention; every decode token runs every layer."""
    from benchmarks.workloads import workload_flops

    shape = model_shape()
    h, layers = shape.hidden_size, shape.num_hidden_layers
    one = workload_flops([BenchRequest([5] * 6, 1)], shape)  # a prompt of 6, one token out
    assert one["linear"] == 2 * (
        shape.params_in_linear_layers * 6 - 5 * shape.last_layer_unsampled_skip
    )
    assert one["attention"] == 4 * h * (layers * 21 - 15)  # 1 + ... + 6 keys; the last layer 6
    two = workload_flops([BenchRequest([5] * 6, 3)], shape)  # two tokens fed back, both sampled
    assert two["linear"] - one["linear"] == 2 * 2 * shape.params_in_linear_layers
    assert two["attention"] - one["attention"] == 4 * h * layers * (7 + 8)


def test_compute_bound_steps_add_their_excess() -> None:
    shape = model_shape()
    reqs = [BenchRequest([5] * 8, 5) for _ in range(64)]
    slow_compute = physical_floor(reqs, shape, gemm_gflops=1.0, read_gbps=1000.0)
    assert slow_compute.decode_compute_extra_s > 0
    fast_compute = physical_floor(reqs, shape, gemm_gflops=1e6, read_gbps=10.0)
    assert fast_compute.decode_compute_extra_s == 0


def test_half_precision_floor_reads_half_the_bytes() -> None:
    """A bf16 engine on a GPU (offline_throughput.py --gpu-roofline): weights and K/V of two
    bytes each, so every byte-bound part of the floor halves; the FLOPs do not change."""
    shape = model_shape("llama-1b")
    reqs = [BenchRequest([5] * 40, 9), BenchRequest([5] * 12, 4)]
    fp32 = physical_floor(reqs, shape, gemm_gflops=1e6, read_gbps=4000.0)
    bf16 = physical_floor(reqs, shape, gemm_gflops=1e6, read_gbps=4000.0, bytes_per_element=2)
    assert kv_bytes_per_position(shape, 2) * 2 == kv_bytes_per_position(shape)
    assert bf16.decode_weights_s == pytest.approx(fp32.decode_weights_s / 2)
    assert bf16.decode_kv_s == pytest.approx(fp32.decode_kv_s / 2)
    assert bf16.prefill_s == fp32.prefill_s and bf16.bytes_per_element == 2


def test_a_bf16_checkpoint_in_fp32_halves_only_the_weights() -> None:
    """offline_throughput.py --checkpoint-dtype bfloat16: the engines compute in fp32, but a
    bf16 checkpoint's weights can be read exactly at 2 bytes each; its K/V stay fp32."""
    shape = model_shape("smollm2-135m")
    reqs = [BenchRequest([5] * 40, 9), BenchRequest([5] * 12, 4)]
    fp32 = physical_floor(reqs, shape, gemm_gflops=1e6, read_gbps=30.0)
    ckpt = physical_floor(reqs, shape, gemm_gflops=1e6, read_gbps=30.0, weight_bytes_per_element=2)
    assert ckpt.decode_weights_s == pytest.approx(fp32.decode_weights_s / 2)
    assert ckpt.decode_kv_s == fp32.decode_kv_s and ckpt.prefill_s == fp32.prefill_s
    assert (ckpt.bytes_per_element, ckpt.weight_bytes_per_element) == (4, 2)


def test_the_screened_head_floor_halves_only_the_lm_head() -> None:
    """pdserve's greedy head reads the lm_head as its bf16 screen: in decode steps its weights
    count 2 bytes each and its products half the float32 time; the decoder's weights, the K/V
    and the prefill are the float32 floor's."""
    shape = model_shape("smollm2-135m")
    reqs = [BenchRequest([5] * 40, 9), BenchRequest([5] * 12, 4)]
    fp32 = physical_floor(reqs, shape, gemm_gflops=1e6, read_gbps=30.0)
    head = physical_floor(reqs, shape, gemm_gflops=1e6, read_gbps=30.0, screened_head=True)
    saved = fp32.decode_steps * 2 * shape.lm_head_params / 30e9
    assert head.decode_weights_s == pytest.approx(fp32.decode_weights_s - saved)
    assert head.decode_kv_s == fp32.decode_kv_s and head.prefill_s == fp32.prefill_s
    compute = physical_floor(reqs, shape, gemm_gflops=1.0, read_gbps=1e6)
    compute_head = physical_floor(reqs, shape, gemm_gflops=1.0, read_gbps=1e6, screened_head=True)
    running = 8 + 3  # request-steps: 8 decodes of the first, 3 of the second
    head_s = running * shape.lm_head_params / 1e9  # half of 2 FLOPs a parameter, at 1 GFLOP/s
    assert compute.decode_s - compute_head.decode_s == pytest.approx(head_s, rel=1e-3)


@pytest.mark.parametrize("kind", ["bf16", "int16", ""])
def test_the_screened_floor_is_printed_only_where_the_head_ran(
    kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Where the head did not run every logit is float32: no screened floor is priced."""
    ran = bool(kind)
    shape = model_shape("smollm2-135m")
    reqs = [BenchRequest([5] * 40, 9)]
    head = physical_floor(reqs, shape, gemm_gflops=1e3, read_gbps=30.0, screened_head=True)
    summary = {"pdserve": {"median_wall_s": 2 * head.total_s}}
    results = {"pdserve": {"settings": {"greedy_head": kind}}}
    report.print_screened_floor(head, summary, results)
    out = capsys.readouterr().out
    assert ("pdserve 50.0% of it" in out) == ran and (f"({kind} screen" in out) == ran
    assert ("not priced" in out) == (not ran)
