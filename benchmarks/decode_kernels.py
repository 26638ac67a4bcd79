"""One decode step's attention and GEMMs in the compiled CPU kernels: this checkout against others.

    python benchmarks/decode_kernels.py [--against /path/to/other/worktree ...] [--rounds 2]
                                        [--seqs 18]

The offline benchmark's decode step, SmolLM2-135M's shape: 18 requests (``--seqs``) with 32-640
tokens of context (seed 0), block size 16, blocks shuffled in a block-major pool that the
checkout's own ``engine.kv_cache.KVCache`` allocates (so how a checkout lays out its pool's memory
is part of what is measured); ``paged_attention`` over the 30 layers, then the 30 layers' four
GEMMs and the lm_head at as many rows (18) through the checkout's own ``PackedLinear`` (random
weights, packed into one buffer as the engine packs them). Each checkout runs in its own
subprocess, taking turns ``--rounds`` times (``benchmarks/ab_checkouts.py``); per checkout the
median of its rounds' medians (15 passes each). Also prints the read bandwidth a multi-threaded
``sum`` over 512 MB reaches in the same process, and the attention's time over reading its K/V once
at that rate. Beside it, the same 30 calls on the first layer's K/V alone, which stays in the
caches between calls where they hold it (one layer's is ~9 MB): the part of the attention's time
that is arithmetic and cache hits, not waiting on memory. (What streaming the weights costs the
GEMMs: ``benchmarks/gemm_sources.py``.)

``--against`` is another working tree, e.g. ``git worktree add /tmp/base <commit>``.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.ab_checkouts import alternate
from benchmarks.workloads import model_shape

CONTEXT, BLOCK, PASSES = (32, 640), 16, 15

# Runs in the subprocess, with the checkout's root first on sys.path.
CHILD = """
import json, random, statistics, sys, time
sys.path.insert(0, sys.argv[1])
import torch
from torch import nn
from engine.kv_cache import KVCache
from engine.kv_cache_spec import KVCacheSpec
from engine.models.layers import PackedLinear
from engine.packed_weights import empty_packed_weights, pack_into
from kernels.cpu import load
ops = load()
assert ops is not None, "compiled CPU kernels unavailable"
layers, heads, kv_heads, dim, hidden, inter, vocab = {shape}
seqs, (c_lo, c_hi), bs, passes = {seqs}, {context}, {block}, {passes}
torch.manual_seed(0)
rng = random.Random(0)
lens = [rng.randint(c_lo, c_hi) + 1 for _ in range(seqs)]
per_seq = [-(-n // bs) for n in lens]
spec = KVCacheSpec(layers, kv_heads, dim, bs, "float32")
cache = KVCache(spec, sum(per_seq) + 8, 0, torch.device("cpu"))
cache.pool.normal_()
ids = list(range(cache.num_blocks))
rng.shuffle(ids)
width, at, rows = max(per_seq), 0, []
for n in per_seq:
    rows.append(ids[at : at + n] + [0] * (width - n))
    at += n
table = torch.tensor(rows, dtype=torch.int32)
qsl = torch.arange(seqs + 1, dtype=torch.int32)
seq_lens = torch.tensor(lens, dtype=torch.int32)
q = torch.randn(seqs, heads, dim)
o = torch.empty_like(q)
shapes = [((heads + 2 * kv_heads) * dim, hidden), (hidden, heads * dim), (2 * inter, hidden),
          (hidden, inter)]
plain = [nn.Linear(k, n, bias=False) for _ in range(layers) for n, k in shapes]
plain.append(nn.Linear(hidden, vocab, bias=False))
# Packed into one buffer on huge pages, in the order a step reads them, as the engine packs them.
views = empty_packed_weights([(m.out_features, m.in_features) for m in plain], ops)
linears = [PackedLinear(m, ops, pack_into(v, m.weight, ops)) for m, v in zip(plain, views)]
head = linears.pop()
del plain, views  # the unpacked weights, as the engine releases them
xs = {{k: torch.randn(seqs, k) for k in (hidden, heads * dim, inter)}}

def attention():
    for kc, vc in cache.layer_caches:
        ops.paged_attention(o, q, kc, vc, table, qsl, seq_lens, dim ** -0.5, 0)

kc0, vc0 = cache.layer_caches[0]
def attention_cached():
    for _ in cache.layer_caches:
        ops.paged_attention(o, q, kc0, vc0, table, qsl, seq_lens, dim ** -0.5, 0)

def gemms():
    for lin in linears:
        lin(xs[lin.in_features])

def lm_head():
    head(xs[hidden])

buf = torch.ones(512 << 18)
def read():
    float(buf.sum())

out = {{}}
with torch.inference_mode():
    for name, fn in (("read", read), ("attention", attention),
                     ("attention_cached", attention_cached), ("gemms", gemms),
                     ("lm_head", lm_head)):
        fn()
        times = []
        for _ in range(passes):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        out[name] = min(times) if name == "read" else statistics.median(times)
print("RESULT " + json.dumps(out))
"""


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--against", type=Path, action="append", default=[])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seqs", type=int, default=18, help="decode requests (rows) in the step")
    args = parser.parse_args(argv)
    seqs = args.seqs
    s = model_shape()
    dims = (
        s.num_hidden_layers,
        s.num_attention_heads,
        s.num_key_value_heads,
        s.head_dim,
        s.hidden_size,
        s.intermediate_size,
        s.vocab_size,
    )
    code = CHILD.format(shape=dims, seqs=seqs, context=CONTEXT, block=BLOCK, passes=PASSES)
    here = Path(__file__).resolve().parent.parent
    trees = [here, *[p.resolve() for p in args.against]]
    medians = {str(t): m for t, m in alternate(trees, code, args.rounds).items()}

    rng = random.Random(0)
    positions = sum(rng.randint(*CONTEXT) + 1 for _ in range(seqs))
    kv_bytes = positions * 2 * s.num_key_value_heads * s.head_dim * 4 * s.num_hidden_layers
    gemm_flops = 2 * seqs * s.params_in_linear_layers
    head_flops = 2 * seqs * s.lm_head_params
    print(f"decode step: {seqs} requests, {positions} positions, K/V {kv_bytes / 1e6:.0f} MB")
    base = medians[str(here)]
    for t in trees:
        m = medians[str(t)]
        gbps = 512 * (1 << 20) / m["read"] / 1e9
        att, gemm, lm = m["attention"], m["gemms"], m["lm_head"]
        print(
            f"{t}\n  read {gbps:5.1f} GB/s | attention {att * 1e3:6.1f} ms "
            f"({kv_bytes / att / 1e9:4.1f} GB/s, x{att * gbps * 1e9 / kv_bytes:.2f} of reading "
            f"K/V once) x{att / base['attention']:.2f} of this checkout"
            f"\n  attention on one layer's K/V, in cache: {m['attention_cached'] * 1e3:6.1f} ms "
            f"x{m['attention_cached'] / base['attention_cached']:.2f}"
            f"\n  GEMMs {gemm * 1e3:6.1f} ms ({gemm_flops / gemm / 1e9:5.1f} GFLOP/s) "
            f"x{gemm / base['gemms']:.2f} | lm_head {lm * 1e3:5.1f} ms "
            f"({head_flops / lm / 1e9:5.1f} GFLOP/s) x{lm / base['lm_head']:.2f}"
        )
    return medians


if __name__ == "__main__":
    main()
