"""The decoder GEMMs as the engine runs them against the same kernels back to back.

    python benchmarks/engine_gemms.py [--num-requests 32]

Runs the offline-throughput workload (same seed, same model folder) through pdserve's ``LLM``
with the per-kernel Python layer (``PDSERVE_FUSED_LAYERS=0``, so every GEMM goes through
``PackedLinear.forward``) and times each decoder GEMM call alone (``perf_counter`` around the
compiled ``linear`` only, or ``linear_silu_mul`` for gate_up, which runs with its activation:
no module hooks), by its row count. Then, in the same process, it
runs the model's own 120 packed decoder weights back to back at the most frequent decode row
counts, and prints both per pass of the 30 layers, with the GFLOP/s they reach: whether the
engine's GEMMs lose time to what runs between them (attention streaming the KV, the Python
around them), or run as fast as the kernel does alone.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.workloads import DEFAULT_MODEL_DIR, ensure_model_folder, make_workload, model_shape


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--passes", type=int, default=9, help="back-to-back passes per row count")
    p.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    args = p.parse_args(argv)
    os.environ["PDSERVE_FUSED_LAYERS"] = "0"

    import torch

    from engine.models.layers import PackedGateUpSiLU, PackedLinear
    from pdserve import LLM, SamplingParams

    shape = model_shape()
    llm = LLM(model=str(ensure_model_folder(args.model_dir)), dtype="float32")
    model = llm.engine.runner.model
    layers = [
        m
        for m in model.modules()
        if isinstance(m, PackedLinear) and m.out_features != shape.vocab_size
    ]
    if not layers:
        print("no packed linears (no CPU kernels?)", file=sys.stderr)
        return 1
    calls: dict[int, list[float]] = defaultdict(list)
    forwards = (PackedLinear.forward, PackedGateUpSiLU.forward)

    def timed(self: Any, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        t0 = time.perf_counter()
        if isinstance(self, PackedGateUpSiLU):  # gate_up with its activation, as the MLP runs it
            y = self.kernels.linear_silu_mul(rows, self.packed, self.out_features // 2)
        else:
            y = self.kernels.linear(rows, self.packed, self.out_features, self.bias)
        dt = time.perf_counter() - t0
        if self.out_features != shape.vocab_size:
            calls[rows.shape[0]].append(dt)
        return y.view(*x.shape[:-1], y.shape[-1])

    PackedLinear.forward = timed  # type: ignore[method-assign]
    PackedGateUpSiLU.forward = timed  # type: ignore[method-assign]
    requests = make_workload(args.num_requests, (32, 512), (16, 256), shape.vocab_size, args.seed)
    try:
        llm.generate(
            [{"prompt_token_ids": r.prompt_token_ids} for r in requests],
            [
                SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True)
                for r in requests
            ],
        )
    finally:
        PackedLinear.forward, PackedGateUpSiLU.forward = forwards  # type: ignore[method-assign]
    flops_per_row = 2.0 * sum(m.in_features * m.out_features for m in layers)
    decode_rows = sorted((m for m in calls if m <= 64), key=lambda m: len(calls[m]), reverse=True)[
        :4
    ]
    print(
        f"{len(layers)} packed decoder GEMMs ({len(layers) // shape.num_hidden_layers} a layer), "
        f"threads {torch.get_num_threads()}; ms per pass of the 30 layers"
    )
    with torch.inference_mode():
        for m in sorted(decode_rows):
            engine_ms = statistics.median(calls[m]) * len(layers) * 1e3
            engine_sum = sum(calls[m]) / (len(calls[m]) / len(layers)) * 1e3
            xs = {k: torch.randn(m, k) for k in {layer.in_features for layer in layers}}
            passes = []
            for _ in range(args.passes):
                t0 = time.perf_counter()
                for layer in layers:
                    x = xs[layer.in_features]
                    if isinstance(layer, PackedGateUpSiLU):  # as the engine runs it
                        layer.kernels.linear_silu_mul(x, layer.packed, layer.out_features // 2)
                    else:
                        layer.kernels.linear(x, layer.packed, layer.out_features, layer.bias)
                passes.append(time.perf_counter() - t0)
            alone = statistics.median(passes) * 1e3
            gflops = flops_per_row * m / (engine_sum / 1e3) / 1e9
            print(
                f"  M={m:<3} in the engine {engine_sum:6.1f} ms ({gflops:5.1f} GFLOP/s; "
                f"{len(calls[m]) // len(layers)} passes; {engine_ms:.1f} from the per-call "
                f"median)   back to back {alone:6.1f} ms (median of {args.passes})   "
                f"engine / alone {engine_sum / alone:.2f}x"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
