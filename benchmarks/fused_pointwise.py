"""The decoder layer's pointwise steps three ways: eager torch, ``torch.compile`` (inductor's CPU
C++ backend, dynamic shapes, from a cold cache) and the compiled CPU kernels.

    python benchmarks/fused_pointwise.py [--rows 18 2048]

Per layer: two add+RMSNorm (before attention and before the MLP), rotary on q and k, SiLU·mul,
at the offline benchmark model's sizes (hidden 576, 9/3 heads of 64, intermediate 1536), over
30 layers. Prints torch.compile's cold compile time (a fresh ``TORCHINDUCTOR_CACHE_DIR``, as on
a fresh machine), the time of its first calls at new row counts, and per step the fastest wall
time and least CPU time of ``--passes`` passes for each way.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=[18, 2048])
    p.add_argument("--passes", type=int, default=20)
    args = p.parse_args()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-cold-")

    import torch
    import torch.nn.functional as F

    from engine.models.layers import RotaryEmbedding, apply_rotary
    from kernels.cpu import load

    def add_rms(x: torch.Tensor, res: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = res + x
        hf = h.float()
        var = hf.pow(2).mean(-1, keepdim=True)
        return w * (hf * torch.rsqrt(var + 1e-5)).to(h.dtype), h

    def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> object:
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)

    def silu_mul(gu: torch.Tensor) -> torch.Tensor:
        g, u = gu.chunk(2, dim=-1)
        return F.silu(g) * u

    compiled = [torch.compile(f, dynamic=True) for f in (add_rms, rope, silu_mul)]
    rot = RotaryEmbedding(tuple((1e5 ** (-torch.arange(0, 64, 2).float() / 64)).tolist()), 8192, 1)
    w = torch.randn(576)

    def inputs(m: int) -> dict[str, torch.Tensor]:
        qkv = torch.randn(m, 960)
        pos = torch.randint(0, 8192, (m,))
        cos, sin = rot.lookup(pos, torch.float32)
        return {
            "x": torch.randn(m, 576),
            "r": torch.randn(m, 576),
            "q": qkv[:, :576].view(m, 9, 64),
            "k": qkv[:, 576:768].view(m, 3, 64),
            "cos": cos,
            "sin": sin,
            "pos": pos,
            "gu": torch.randn(m, 3072),
        }

    with torch.inference_mode():
        a = inputs(args.rows[0])
        t0 = time.perf_counter()
        compiled[0](a["x"], a["r"], w)
        compiled[1](a["q"], a["k"], a["cos"], a["sin"])
        compiled[2](a["gu"])
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        for m in (1, 7, 300):
            b = inputs(m)
            compiled[0](b["x"], b["r"], w)
            compiled[1](b["q"], b["k"], b["cos"], b["sin"])
            compiled[2](b["gu"])
        more = time.perf_counter() - t0
    print(
        f"torch.compile: cold compile {cold:.1f} s; first calls at 3 more row counts {more:.1f} s"
    )
    kernels: Any = load()

    def bench(step: Callable[[], None]) -> tuple[float, float]:
        step()
        best = cpu = float("inf")
        for _ in range(args.passes):
            c0, t0 = time.process_time(), time.perf_counter()
            step()
            best = min(best, time.perf_counter() - t0)
            cpu = min(cpu, time.process_time() - c0)
        return best, cpu

    with torch.inference_mode():
        for m in args.rows:
            a = inputs(m)
            stream = a["r"].clone()

            def eager(a: dict[str, torch.Tensor] = a) -> None:
                for _ in range(30):
                    add_rms(a["x"], a["r"], w)
                    add_rms(a["x"], a["r"], w)
                    rope(a["q"], a["k"], a["cos"], a["sin"])
                    silu_mul(a["gu"])

            def inductor(a: dict[str, torch.Tensor] = a) -> None:
                for _ in range(30):
                    compiled[0](a["x"], a["r"], w)
                    compiled[0](a["x"], a["r"], w)
                    compiled[1](a["q"], a["k"], a["cos"], a["sin"])
                    compiled[2](a["gu"])

            def kernel(a: dict[str, torch.Tensor] = a, s: torch.Tensor = stream) -> None:
                for _ in range(30):
                    kernels.add_rms_norm(s, a["x"], w, 1e-5)
                    kernels.add_rms_norm(s, a["x"], w, 1e-5)
                    kernels.rotary_(a["q"], a["k"], rot.cos, rot.sin, a["pos"])
                    kernels.silu_mul(a["gu"])

            ways = [("eager torch", eager), ("torch.compile", inductor)]
            if kernels is not None:
                ways.append(("pdserve kernels", kernel))
            for name, fn in ways:
                best, cpu = bench(fn)
                print(f"M={m:<5} {name:<16} {best * 1e3:8.2f} ms wall, {cpu * 1e3:8.2f} ms CPU")


if __name__ == "__main__":
    main()
