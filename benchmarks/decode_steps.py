"""The engine's whole decode step on the CPU: this checkout against others, alternating.

    python benchmarks/decode_steps.py [--against /path/to/other/worktree ...] [--rounds 6]
                                      [--seqs 18]

What a kernel A/B (``decode_kernels.py``) leaves out is here too: the model's Python, the
calls into the kernels, sampling, scheduling and outputs. Each checkout, in its own subprocess
(``benchmarks/ab_checkouts.py``), loads the offline benchmark's model (SmolLM2-135M shape,
random weights, fp32), prefills 18 requests (``--seqs``) of 32-500 random tokens (seed 0), then
times 60 decode steps of ``LLMEngine.step()`` after 5 untimed ones; its result is the median
step. The rounds alternate the checkouts' order; per checkout the median of its rounds is
printed, with every round's figure and the ratio to this checkout.

``--phases`` also reports, per step, what the fused decoder layers' phases took (the kernels'
phase timers, ``PDSERVE_CPU_PHASE_TIMERS=1``): GEMMs, attention, KV store, pointwise ops.
``--touched-pool`` writes the whole KV pool once before the requests arrive, as a server that
has run a while has: no step then pays a page's first touch (with the pool on huge pages each
first touch of 2 MiB took ~1-3.5 ms on the 2-core VM; docs/benchmarks.md). Engines with
``kv_cache_prefault`` (the default since 2026-12-04) do that themselves; the flag puts an older
checkout on the same footing.

``--against`` is another working tree, e.g. ``git worktree add /tmp/base <commit>``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.ab_checkouts import alternate_rounds
from benchmarks.workloads import default_model_dir, ensure_model_folder

SEQS, PROMPT, WARMUP, STEPS = 18, (32, 500), 5, 60

# Runs in the subprocess, with the checkout's root first on sys.path.
CHILD = """
import json, os, random, statistics, sys, time
sys.path.insert(0, sys.argv[1])
phases, touched = {phases}, {touched}
if phases:
    os.environ["PDSERVE_CPU_PHASE_TIMERS"] = "1"  # read by the kernels at their first layer
from engine.engine_config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
seqs, (lo, hi), warmup, steps = {seqs}, {prompt}, {warmup}, {steps}
model, vocab = {model!r}, {vocab}
engine = LLMEngine(EngineConfig(model=model, dtype="float32"))
if touched:
    engine.kv_cache.pool.zero_()
rng = random.Random(0)
# Room for the tokens early requests decode while later prompts prefill beside them (in 512-token
# chunks since the servers' prefill cap, 3-4x more steps than the whole budget took).
params = SamplingParams(temperature=0.0, max_tokens=warmup + steps + 200, ignore_eos=True)
for i in range(seqs):
    prompt = [rng.randrange(10, vocab) for _ in range(rng.randint(lo, hi))]
    engine.add_request(f"r{{i}}", prompt_token_ids=prompt, sampling_params=params)
running = engine.scheduler.running
while engine.scheduler.waiting or any(r.num_computed_tokens < r.num_prompt_tokens for r in running):
    engine.step()
for _ in range(warmup):
    engine.step()
if phases:
    from kernels.cpu import load
    ops = load()
    ops.phase_times(True)
times = []
for _ in range(steps):
    t = time.perf_counter()
    engine.step()
    times.append(time.perf_counter() - t)
assert len(engine.scheduler.running) == seqs, "a request finished inside the timed steps"
result = {{"step_s": statistics.median(times)}}
if phases:
    per_step = dict((n, s / steps) for n, s in zip(*ops.phase_times(True)))
    result["gemms_s"] = sum(per_step[n] for n in ("qkv", "o", "gate_up", "down"))
    result["attention_s"] = per_step["attention"]
    result["store_kv_s"] = per_step["store_kv"]
    # Checkouts before linear_silu_mul timed the activation alone; since, gate_up includes it.
    result["pointwise_s"] = sum(per_step.get(n, 0.0) for n in ("norms", "rotary", "silu_mul"))
print("RESULT " + json.dumps(result))
"""

PHASES = (
    ("gemms_s", "GEMMs"),
    ("attention_s", "attention"),
    ("store_kv_s", "KV store"),
    ("pointwise_s", "norms, rotary, SiLU-mul"),
)


def main(argv: list[str] | None = None) -> dict[str, list[float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--against", type=Path, action="append", default=[])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument(
        "--seqs", type=int, default=SEQS, help=f"running requests in each step (default {SEQS})"
    )
    parser.add_argument(
        "--phases", action="store_true", help="also the fused layers' phases (phase timers)"
    )
    parser.add_argument(
        "--touched-pool",
        action="store_true",
        help="write the whole KV pool before the requests (no first touch inside the steps)",
    )
    parser.add_argument(
        "--model-dir",
        type=Path,
        default=None,
        help="a model folder to run as it is (default: the offline benchmark's, made once)",
    )
    args = parser.parse_args(argv)
    folder = args.model_dir or ensure_model_folder(default_model_dir("smollm2-135m"))
    vocab = int(json.loads((folder / "config.json").read_text())["vocab_size"])
    code = CHILD.format(
        seqs=args.seqs,
        prompt=PROMPT,
        warmup=WARMUP,
        steps=STEPS,
        model=str(folder),
        vocab=vocab,
        phases=args.phases,
        touched=args.touched_pool,
    )
    here = Path(__file__).resolve().parent.parent
    trees = [here, *[p.resolve() for p in args.against]]
    runs = alternate_rounds(trees, code, args.rounds)
    rounds = {t: [r["step_s"] for r in rs] for t, rs in runs.items()}
    medians = {t: statistics.median(v) for t, v in rounds.items()}
    pool = "pool touched before" if args.touched_pool else "pool as the engine leaves it"
    print(
        f"decode step of {args.seqs} requests, median of {STEPS} steps a round,"
        f" {args.rounds} rounds ({pool})"
    )
    for t in trees:
        cells = " ".join(f"{x * 1e3:.1f}" for x in rounds[t])
        print(
            f"{t}\n  {medians[t] * 1e3:.2f} ms (rounds: {cells}) "
            f"x{medians[t] / medians[here]:.3f} of this checkout"
        )
        if args.phases:
            parts = []
            for key, label in PHASES:
                m = statistics.median(r[key] for r in runs[t])
                m_here = statistics.median(r[key] for r in runs[here])
                ratio = f"x{m / m_here:.2f}" if m_here > 0 else "-"
                parts.append(f"{label} {m * 1e3:.2f} ({ratio})")
            print("  phases, ms a step (median of rounds): " + ", ".join(parts))
    return {str(t): v for t, v in rounds.items()}


if __name__ == "__main__":
    main()
