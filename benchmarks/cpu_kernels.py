"""The compiled CPU kernels against their torch baselines and the machine's floors, one decode
step of the offline benchmark's model at a time.

    python benchmarks/cpu_kernels.py [--seqs 18] [--context 100 600] [--rows 1 18 32]

Sections, each printed as a table; every figure is the fastest of ``--passes`` passes (the
machine is shared: the fastest pass is what the cores do when nothing else runs; the median is
printed beside it to show the load):

- **read**: streaming read bandwidth (a two-thread ``sum`` over a buffer larger than any cache)
  — the floor every memory-bound figure below is held against;
- **attention**: one decode step's attention over all 30 layers of a block-major pool (random
  block ids, contexts uniform in ``--context``): the torch backend, the cpu backend, and the
  time to read the step's K/V bytes once at the measured bandwidth;
- **gemm**: all 30 decoder layers' GEMMs (qkv, o, gate_up, down; own weights per layer, 425 MB,
  so nothing stays cached) plus the lm_head, at decode row counts, each way of
  ``benchmarks/gemm_options.py``: ``F.linear``, MKL packed, oneDNN packed, the pdserve packed
  GEMM (and with ``--inductor``, ``torch.compile`` with inductor's weight freezing over all of
  them in one graph, compile time printed), against the weights' bytes at the measured read
  bandwidth;
- **elementwise**: one step's add+RMSNorm, rotary and SiLU·mul over 30 layers, torch ops vs the
  kernels.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import gemm_options
from benchmarks.workloads import model_shape

Timing = dict[str, float]


def time_passes(fn: Callable[[], object], passes: int) -> Timing:
    """Fastest and median wall seconds of ``passes`` calls after one warm-up call, and the
    least CPU seconds (all threads) a call took: on a loaded machine the CPU time still says
    how much work a call is when the wall time mostly says how long it waited for a core."""
    fn()
    times, cpu = [], []
    for _ in range(passes):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return {"best_s": min(times), "median_s": statistics.median(times), "cpu_s": min(cpu)}


def read_bandwidth(passes: int, mbytes: int = 512) -> float:
    """GB/s of the fastest pass of a multi-threaded ``sum`` over ``mbytes`` MB of float32."""
    buf = torch.ones(mbytes * (1 << 20) // 4)
    t = time_passes(lambda: float(buf.sum()), passes)
    return buf.numel() * 4 / t["best_s"] / 1e9


# ------------------------------------------------------------------------------- attention
def attention_section(args: argparse.Namespace, kernels: Any, gbps: float) -> dict[str, Any]:
    from engine.attention.backend import AttentionMetadata
    from engine.attention.cpu_backend import CpuAttentionBackend
    from engine.attention.torch_backend import TorchAttentionBackend

    shape = model_shape()
    heads, kv_heads, dim = shape.num_attention_heads, shape.num_key_value_heads, shape.head_dim
    layers, bs = shape.num_hidden_layers, args.block_size
    rng = random.Random(0)
    ctx = [rng.randint(*args.context) for _ in range(args.seqs)]
    seq_lens = [c + 1 for c in ctx]
    blocks_per_seq = [-(-s // bs) for s in seq_lens]
    num_blocks = sum(blocks_per_seq) + 8
    pool = torch.randn(num_blocks, layers, 2, bs, kv_heads, dim)
    ids = list(range(num_blocks))
    rng.shuffle(ids)
    tables, at = [], 0
    width = max(blocks_per_seq)
    for n in blocks_per_seq:
        tables.append(ids[at : at + n] + [0] * (width - n))
        at += n
    slots = [tables[i][(s - 1) // bs] * bs + (s - 1) % bs for i, s in enumerate(seq_lens)]
    i32 = lambda x: torch.tensor(x, dtype=torch.int32)  # noqa: E731
    meta = AttentionMetadata(
        num_tokens=args.seqs,
        num_seqs=args.seqs,
        query_start_loc=i32(list(range(args.seqs + 1))),
        query_lens=i32([1] * args.seqs),
        context_lens=i32(ctx),
        seq_lens=i32(seq_lens),
        block_tables=i32(tables),
        slot_mapping=torch.tensor(slots, dtype=torch.long),
        max_query_len=1,
        max_seq_len=max(seq_lens),
        query_lens_cpu=(1,) * args.seqs,
        seq_lens_cpu=tuple(seq_lens),
    )
    qkv = torch.randn(args.seqs, (heads + 2 * kv_heads) * dim)
    q = qkv[:, : heads * dim].view(args.seqs, heads, dim)
    k = qkv[:, heads * dim : (heads + kv_heads) * dim].view(args.seqs, kv_heads, dim)
    v = qkv[:, (heads + kv_heads) * dim :].view(args.seqs, kv_heads, dim)
    caches = [(pool[:, layer, 0], pool[:, layer, 1]) for layer in range(layers)]
    kv_bytes = sum(seq_lens) * kv_heads * dim * 4 * 2 * layers

    def step(backend: Any, dense_v: bool) -> Callable[[], None]:
        vv = v.contiguous() if dense_v else v

        def run() -> None:
            backend.prepare(meta, bs)
            for kc, vc in caches:
                backend.forward(q, k, vv, kc, vc, meta, dim**-0.5)

        return run

    rows: dict[str, Any] = {"floor_s": kv_bytes / (gbps * 1e9), "kv_bytes": kv_bytes}
    with torch.inference_mode():
        rows["torch"] = time_passes(step(TorchAttentionBackend(), True), args.passes)
        if kernels is not None:
            rows["cpu"] = time_passes(step(CpuAttentionBackend(kernels), False), args.passes)
    rows["context_tokens"] = sum(seq_lens)
    return rows


# ------------------------------------------------------------------------------------ gemm
def gemm_section(args: argparse.Namespace, kernels: Any, gbps: float) -> dict[str, Any]:
    shape = model_shape()
    fused = shape.fused_linear_shapes()
    torch.manual_seed(0)
    weights = shape.random_layer_weights()
    lm_head = torch.randn(shape.vocab_size, shape.hidden_size) * 0.02
    layer_bytes = sum(w.numel() * 4 for layer in weights for w in layer)
    head_bytes = lm_head.numel() * 4

    makers = gemm_options.makers(kernels)

    result: dict[str, Any] = {"layer_bytes": layer_bytes, "lm_head_bytes": head_bytes}
    result["floor_layers_s"] = layer_bytes / (gbps * 1e9)
    result["floor_lm_head_s"] = head_bytes / (gbps * 1e9)
    with torch.inference_mode():
        for m in args.rows:
            xs = {k: torch.randn(m, k) for k, _ in fused}
            by_impl: dict[str, Any] = {}
            for name, make in makers.items():
                try:
                    fns = [[make(w, m) for w in layer] for layer in weights]
                    head = make(lm_head, m)
                except (RuntimeError, AttributeError) as e:
                    by_impl[name] = {"error": str(e).splitlines()[0]}
                    continue

                def layers_pass(
                    fns: list[list[gemm_options.Linear]] = fns, xs: dict[int, torch.Tensor] = xs
                ) -> None:
                    for layer in fns:
                        for f, (k, _) in zip(layer, fused, strict=True):
                            f(xs[k])

                x_head = torch.randn(m, shape.hidden_size)

                def head_pass(
                    head: gemm_options.Linear = head, x_head: torch.Tensor = x_head
                ) -> None:
                    head(x_head)

                by_impl[name] = {
                    "layers": time_passes(layers_pass, args.passes),
                    "lm_head": time_passes(head_pass, args.passes * 2),
                }
                del fns, head
            if args.inductor:
                xs_list = [xs[k] for k, _ in fused]
                layers_call, head_call, compile_s = gemm_options.inductor_frozen(
                    weights, lm_head, xs_list
                )
                by_impl["inductor frozen"] = {
                    "layers": time_passes(layers_call, args.passes),
                    "lm_head": time_passes(head_call, args.passes * 2),
                    "compile_s": compile_s,
                }
            result[str(m)] = by_impl
    return result


# ----------------------------------------------------------------------------- elementwise
def elementwise_section(args: argparse.Namespace, kernels: Any) -> dict[str, Any]:
    from engine.models.layers import RMSNorm, RotaryEmbedding, apply_rotary

    shape = model_shape()
    h, heads, kv_heads = shape.hidden_size, shape.num_attention_heads, shape.num_key_value_heads
    dim, inter, layers = shape.head_dim, shape.intermediate_size, shape.num_hidden_layers
    inv = tuple((1e5 ** (-torch.arange(0, dim, 2).float() / dim)).tolist())
    rot = RotaryEmbedding(inv, 8192, 1.0)
    norm = RMSNorm(h, 1e-5)
    result: dict[str, Any] = {}
    with torch.inference_mode():
        for m in args.rows:
            x, res = torch.randn(m, h), torch.randn(m, h)
            qkv = torch.randn(m, (heads + 2 * kv_heads) * dim)
            q = qkv[:, : heads * dim].view(m, heads, dim)
            k = qkv[:, heads * dim : (heads + kv_heads) * dim].view(m, kv_heads, dim)
            gate_up = torch.randn(m, 2 * inter)
            pos = torch.randint(0, 4096, (m,))

            def torch_step(
                x: torch.Tensor = x,
                res: torch.Tensor = res,
                q: torch.Tensor = q,
                k: torch.Tensor = k,
                gate_up: torch.Tensor = gate_up,
                pos: torch.Tensor = pos,
            ) -> None:
                cos, sin = rot.lookup(pos, torch.float32)
                for _ in range(layers):
                    for _ in range(2):
                        norm(res + x)
                    apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
                    gate, up = gate_up.split(inter, dim=-1)
                    F.silu(gate) * up

            by_impl = {"torch": time_passes(torch_step, args.passes)}
            if kernels is not None:
                stream = res.clone()

                def kernel_step(
                    x: torch.Tensor = x,
                    res: torch.Tensor = stream,
                    q: torch.Tensor = q,
                    k: torch.Tensor = k,
                    gate_up: torch.Tensor = gate_up,
                    pos: torch.Tensor = pos,
                ) -> None:
                    for _ in range(layers):
                        for _ in range(2):
                            kernels.add_rms_norm(res, x, norm.weight, 1e-5)
                        kernels.rotary_(q, k, rot.cos, rot.sin, pos)
                        kernels.silu_mul(gate_up)

                by_impl["pdserve"] = time_passes(kernel_step, args.passes)
            result[str(m)] = by_impl
    return result


# ---------------------------------------------------------------------------------- report
def ms(t: Timing | dict[str, Any] | None) -> str:
    if not t or "best_s" not in t:
        return "-"
    return f"{t['best_s'] * 1e3:.1f} ({t['median_s'] * 1e3:.1f}; cpu {t['cpu_s'] * 1e3:.1f})"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sections", nargs="+", default=["attention", "gemm", "elementwise"])
    p.add_argument("--seqs", type=int, default=18, help="decode requests in the step")
    p.add_argument("--context", type=int, nargs=2, default=[100, 600], metavar=("MIN", "MAX"))
    p.add_argument("--block-size", type=int, default=16, help="KV block size (attention)")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 18, 32])
    p.add_argument("--passes", type=int, default=7)
    p.add_argument("--no-kernels", action="store_true", help="baselines only")
    p.add_argument(
        "--inductor",
        action="store_true",
        help="gemm: also torch.compile with inductor's freezing (compiles per row count)",
    )
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    from kernels.cpu import load

    kernels = None if args.no_kernels else load()
    load_avg = os.getloadavg()
    gbps = read_bandwidth(args.passes)
    result: dict[str, Any] = {
        "threads": torch.get_num_threads(),
        "loadavg_start": load_avg,
        "read_gbps": gbps,
        "isa": kernels.isa() if kernels is not None else None,
    }
    print(
        f"threads {torch.get_num_threads()}, load average {load_avg[0]:.2f}, kernels "
        f"{result['isa']}; read bandwidth {gbps:.1f} GB/s; ms as fastest (median; "
        f"least CPU ms) of {args.passes} passes"
    )
    if "attention" in args.sections:
        a = attention_section(args, kernels, gbps)
        result["attention"] = a
        print(
            f"\nattention, one decode step, 30 layers: {args.seqs} requests, "
            f"{a['context_tokens']} context tokens, {a['kv_bytes'] / 1e6:.0f} MB of K/V"
        )
        print(f"  read K/V once at {gbps:.1f} GB/s  {a['floor_s'] * 1e3:.1f} ms")
        for name in ("torch", "cpu"):
            if name in a:
                ratio = a[name]["best_s"] / a["floor_s"]
                print(f"  {name:<30} {ms(a[name]):>16} ms  {ratio:.2f}x the floor")
    if "gemm" in args.sections:
        g = gemm_section(args, kernels, gbps)
        result["gemm"] = g
        print(
            f"\ndecoder GEMMs, 30 layers ({g['layer_bytes'] / 1e6:.0f} MB; floor "
            f"{g['floor_layers_s'] * 1e3:.1f} ms) and lm_head ({g['lm_head_bytes'] / 1e6:.0f} MB;"
            f" floor {g['floor_lm_head_s'] * 1e3:.1f} ms)"
        )
        for m in args.rows:
            for name, t in g[str(m)].items():
                if "error" in t:
                    print(f"  M={m:<4} {name:<16} failed: {t['error']}")
                    continue
                ratio = t["layers"]["best_s"] / g["floor_layers_s"]
                compiled = f"  (compiled in {t['compile_s']:.1f} s)" if "compile_s" in t else ""
                print(
                    f"  M={m:<4} {name:<16} layers {ms(t['layers']):>16} ms ({ratio:.2f}x floor)"
                    f"  lm_head {ms(t['lm_head']):>14} ms{compiled}"
                )
    if "elementwise" in args.sections:
        e = elementwise_section(args, kernels)
        result["elementwise"] = e
        print("\nelementwise per step (2 add+RMSNorm, rotary q/k, SiLU-mul) x 30 layers")
        for m in args.rows:
            cells = "  ".join(f"{n} {ms(t)} ms" for n, t in e[str(m)].items())
            print(f"  M={m:<4} {cells}")
    result["loadavg_end"] = os.getloadavg()
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
