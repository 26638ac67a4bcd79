"""The workload's physical floor: the least time any engine could take on this machine.

    prefill   every prompt token through every linear layer (but the last layer past its
              K/V for the prompt's tokens whose hidden state nobody samples: all but the
              last), causal attention within the prompt (the last layer's for the last token
              alone), the lm_head for each request's first token: FLOPs at the measured peak
              GEMM rate;
    decode    steps = the longest request's output - 1 (every request decodes in the same
              steps, as a continuous batch does). A step reads every weight once (decoder
              layers + lm_head) and every running request's K/V once, and computes its rows;
              its floor is the larger of bytes / read bandwidth and FLOPs / peak GEMM rate.

The sum is a floor for an engine that does exactly this work and nothing else, with weights
and K/V of ``bytes_per_element`` each (4: fp32, the CPU benchmark; 2: bf16 on a GPU), or the
weights of ``weight_bytes_per_element`` (2: a bf16 checkpoint run in fp32, whose weights an
engine can read as bf16 and still compute exactly in fp32): it
ignores that real steps mix prefill chunks with decodes, and all overheads. The compute
roofline (FLOPs / peak) ignores the memory traffic instead; decode steps are bound by it.

``screened_head`` prices the decode steps' lm_head as pdserve's greedy head runs it
(engine/models/greedy_head.py): its screen read at 2 bytes a weight and its products at twice
the float32 rate (a VDPBF16PS or a VPMADDWD does two a lane; the int16 screen measured 1.65x
the float32 FMAs on Zen 4 with AVX2, so for it this is a lower bound), the exact float32 pass
over a few candidates left out. The float32 engine's floor stays the reference; this one says
how much of pdserve's distance to it is work the greedy head no longer does.
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.workloads import BenchRequest, ModelShape, unsampled_prompt_skip

BYTES_PER_PARAM = 4  # fp32, the CPU benchmark's dtype


@dataclass(frozen=True)
class Floor:
    prefill_s: float
    decode_weights_s: float  # the weight-streaming part of the decode steps
    decode_kv_s: float  # the KV-reading part
    decode_compute_extra_s: float  # where a step's FLOPs outlast its bytes
    decode_steps: int
    gemm_gflops: float
    read_gbps: float
    bytes_per_element: int = BYTES_PER_PARAM
    weight_bytes_per_element: int = BYTES_PER_PARAM

    @property
    def decode_s(self) -> float:
        return self.decode_weights_s + self.decode_kv_s + self.decode_compute_extra_s

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s


def kv_bytes_per_position(shape: ModelShape, bytes_per_element: int = BYTES_PER_PARAM) -> int:
    """K and V of one position, all layers."""
    kv_elements = 2 * shape.num_key_value_heads * shape.head_dim * shape.num_hidden_layers
    return kv_elements * bytes_per_element


def physical_floor(
    requests: list[BenchRequest],
    shape: ModelShape,
    gemm_gflops: float,
    read_gbps: float,
    bytes_per_element: int = BYTES_PER_PARAM,
    weight_bytes_per_element: int | None = None,
    screened_head: bool = False,
) -> Floor:
    weight_element = (
        bytes_per_element if weight_bytes_per_element is None else weight_bytes_per_element
    )
    peak, bw = gemm_gflops * 1e9, read_gbps * 1e9
    linear_flops_per_token = 2.0 * shape.params_in_linear_layers
    head_flops_per_token = 2.0 * shape.lm_head_params
    attn_flops_per_key = 4.0 * shape.hidden_size * shape.num_hidden_layers

    prefill_flops = 0.0
    for r in requests:
        n = len(r.prompt_token_ids)
        prefill_flops += linear_flops_per_token * n + head_flops_per_token
        prefill_flops += attn_flops_per_key * n * (n + 1) / 2
        prefill_flops -= sum(unsampled_prompt_skip(shape, n))

    head_element = 2 if screened_head else weight_element
    weight_bytes = weight_element * shape.params_in_linear_layers
    weight_bytes += head_element * shape.lm_head_params
    decode_head_flops = head_flops_per_token / (2.0 if screened_head else 1.0)
    kv_per_pos = kv_bytes_per_position(shape, bytes_per_element)
    steps = max((r.max_tokens - 1 for r in requests), default=0)
    weights_s = kv_s = extra_s = 0.0
    for s in range(steps):
        running = [r for r in requests if r.max_tokens - 1 > s]
        # Decode step s feeds back token s of each running request, at position prompt + s.
        keys = sum(len(r.prompt_token_ids) + s + 1 for r in running)
        t_weights = weight_bytes / bw
        t_kv = keys * kv_per_pos / bw
        flops = (linear_flops_per_token + decode_head_flops) * len(running)
        flops += attn_flops_per_key * keys
        weights_s += t_weights
        kv_s += t_kv
        extra_s += max(0.0, flops / peak - t_weights - t_kv)
    return Floor(
        prefill_s=prefill_flops / peak,
        decode_weights_s=weights_s,
        decode_kv_s=kv_s,
        decode_compute_extra_s=extra_s,
        decode_steps=steps,
        gemm_gflops=gemm_gflops,
        read_gbps=read_gbps,
        bytes_per_element=bytes_per_element,
        weight_bytes_per_element=weight_element,
    )
