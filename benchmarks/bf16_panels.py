"""The packed GEMMs on bf16 panels against float32 panels, for a bf16-exact model.

    python benchmarks/bf16_panels.py [--rows 1 8 18 32 512] [--rounds 7]

The SmolLM2-135M shape's 30 decoder layers (qkv 960 x 576, o 576 x 576, gate_up with its
SiLU epilogue 3,072 x 576, down 576 x 1,536; 425 MB in float32) and its lm_head (49,152 x 576),
every weight a bf16 value in float32 (a bf16 checkpoint loaded in float32), packed both ways
(``engine/packed_weights.py``). Each round times the 120 layer GEMMs in model order (every
weight streamed from memory once, as in a decode step) and the lm_head, float32 panels then
bf16 panels; prints the medians, their ratio, and checks the outputs are the same bits.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

HIDDEN, INTER, LAYERS, VOCAB = 576, 1536, 30, 49152
SHAPES = [(960, HIDDEN), (HIDDEN, HIDDEN), (2 * INTER, HIDDEN), (HIDDEN, INTER)]


def layer_gemms(
    ops: Any, packed: list[list[torch.Tensor]], x: torch.Tensor, xi: torch.Tensor
) -> tuple[float, Any]:
    """Seconds for the 30 layers' GEMMs on ``x`` (``xi`` for down), and the last layer's
    outputs."""
    t0 = time.perf_counter()
    for qkv, o, gate_up, down in packed:
        y = (
            ops.linear(x, qkv, 960, None),
            ops.linear(x, o, HIDDEN, None),
            ops.linear_silu_mul(x, gate_up, INTER),
            ops.linear(xi, down, HIDDEN, None),
        )
    return time.perf_counter() - t0, y


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 18, 32, 512])
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()

    import kernels.cpu

    ops = kernels.cpu.load()
    if ops is None:
        raise SystemExit("the compiled CPU kernels are not available here")
    gen = torch.Generator().manual_seed(0)
    weights = [[torch.randn(n, k, generator=gen).bfloat16().float() for n, k in SHAPES]]
    weights += [[torch.randn(n, k, generator=gen).bfloat16().float() for n, k in SHAPES]]
    # 30 layers of distinct weights (two drawn, the rest copies: every one its own memory).
    layers = [[w.clone() for w in weights[i % 2]] for i in range(LAYERS)]
    packed = {
        bf16: [[ops.pack_linear_weight(w, bf16) for w in layer] for layer in layers]
        for bf16 in (False, True)
    }
    lm = torch.randn(VOCAB, HIDDEN, generator=gen).bfloat16().float()
    lm_packed = {bf16: ops.pack_linear_weight(lm, bf16) for bf16 in (False, True)}
    del layers, lm
    mb = {
        bf16: sum(t.numel() * t.element_size() for layer in packed[bf16] for t in layer) / 1e6
        for bf16 in (False, True)
    }
    print(
        f"30 layers' weights: {mb[False]:.0f} MB on float32 panels, {mb[True]:.0f} MB on bf16 "
        f"panels; threads {torch.get_num_threads()}; medians of {args.rounds} rounds"
    )
    print(
        f"{'rows':>5} {'layers fp32':>12} {'layers bf16':>12} {'x':>6} {'lm_head fp32':>13} "
        f"{'lm_head bf16':>13} {'x':>6}  same bits"
    )
    for rows in args.rows:
        times: dict[str, list[float]] = {k: [] for k in ("l32", "l16", "h32", "h16")}
        same = True
        for _ in range(args.rounds):
            x, xi = torch.randn(rows, HIDDEN), torch.randn(rows, INTER)
            t32, y32 = layer_gemms(ops, packed[False], x, xi)
            t16, y16 = layer_gemms(ops, packed[True], x, xi)
            same &= all(torch.equal(a, b) for a, b in zip(y32, y16, strict=True))
            heads = []
            for key, bf16 in (("h32", False), ("h16", True)):
                t0 = time.perf_counter()
                heads.append(ops.linear(x, lm_packed[bf16], VOCAB, None))
                times[key].append(time.perf_counter() - t0)
            same &= torch.equal(heads[0], heads[1])
            times["l32"].append(t32)
            times["l16"].append(t16)
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        layers_x, head_x = med["l32"] / med["l16"], med["h32"] / med["h16"]
        print(
            f"{rows:>5} {med['l32']:>10.2f}ms {med['l16']:>10.2f}ms {layers_x:>5.2f}x"
            f" {med['h32']:>11.2f}ms {med['h16']:>11.2f}ms {head_x:>5.2f}x  {same}"
        )


if __name__ == "__main__":
    main()
