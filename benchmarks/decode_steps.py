"""The engine's whole decode step on the CPU: this checkout against others, alternating.

    python benchmarks/decode_steps.py [--against /path/to/other/worktree ...] [--rounds 6]

What a kernel A/B (``decode_kernels.py``) leaves out is here too: the model's Python, the
calls into the kernels, sampling, scheduling and outputs. Each checkout, in its own subprocess
(``benchmarks/ab_checkouts.py``), loads the offline benchmark's model (SmolLM2-135M shape,
random weights, fp32), prefills 18 requests of 32-500 random tokens (seed 0), then times 60
decode steps of ``LLMEngine.step()`` after 5 untimed ones; its result is the median step. The
rounds alternate the checkouts' order; per checkout the median of its rounds is printed, with
every round's figure and the ratio to this checkout.

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
from benchmarks.offline_throughput import default_model_dir
from benchmarks.workloads import ensure_model_folder

SEQS, PROMPT, WARMUP, STEPS = 18, (32, 500), 5, 60

# Runs in the subprocess, with the checkout's root first on sys.path.
CHILD = """
import json, random, statistics, sys, time
sys.path.insert(0, sys.argv[1])
from engine.engine_config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
seqs, (lo, hi), warmup, steps = {seqs}, {prompt}, {warmup}, {steps}
model, vocab = {model!r}, {vocab}
engine = LLMEngine(EngineConfig(model=model, dtype="float32"))
rng = random.Random(0)
params = SamplingParams(temperature=0.0, max_tokens=warmup + steps + 8, ignore_eos=True)
for i in range(seqs):
    prompt = [rng.randrange(10, vocab) for _ in range(rng.randint(lo, hi))]
    engine.add_request(f"r{{i}}", prompt_token_ids=prompt, sampling_params=params)
running = engine.scheduler.running
while engine.scheduler.waiting or any(r.num_computed_tokens < r.num_prompt_tokens for r in running):
    engine.step()
for _ in range(warmup):
    engine.step()
times = []
for _ in range(steps):
    t = time.perf_counter()
    engine.step()
    times.append(time.perf_counter() - t)
assert len(engine.scheduler.running) == seqs, "a request finished inside the timed steps"
print("RESULT " + json.dumps({{"step_s": statistics.median(times)}}))
"""


def main(argv: list[str] | None = None) -> dict[str, list[float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--against", type=Path, action="append", default=[])
    parser.add_argument("--rounds", type=int, default=6)
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
        seqs=SEQS, prompt=PROMPT, warmup=WARMUP, steps=STEPS, model=str(folder), vocab=vocab
    )
    here = Path(__file__).resolve().parent.parent
    trees = [here, *[p.resolve() for p in args.against]]
    runs = alternate_rounds(trees, code, args.rounds)
    rounds = {t: [r["step_s"] for r in rs] for t, rs in runs.items()}
    medians = {t: statistics.median(v) for t, v in rounds.items()}
    print(f"decode step of {SEQS} requests, median of {STEPS} steps a round, {args.rounds} rounds")
    for t in trees:
        cells = " ".join(f"{x * 1e3:.1f}" for x in rounds[t])
        print(
            f"{t}\n  {medians[t] * 1e3:.2f} ms (rounds: {cells}) "
            f"x{medians[t] / medians[here]:.3f} of this checkout"
        )
    return {str(t): v for t, v in rounds.items()}


if __name__ == "__main__":
    main()
