"""The greedy head against the float32 logits it replaces, in one process, alternating.

    python benchmarks/greedy_head.py [--model-dir DIR] [--seqs 18] [--blocks 24]

Loads the offline benchmark's model (SmolLM2-135M shape, random weights, fp32; or
``--model-dir``) into an ``LLMEngine``, prefills ``--seqs`` greedy requests of 32-500 random
tokens (seed 0) and times decode steps in alternating blocks of 6: the engine as it is (greedy
rows' tokens from the screened lm_head, ``engine/models/greedy_head.py``; its screen as
``PDSERVE_CPU_GREEDY_HEAD`` picks, by default the fastest here) and the same
engine with its rows sent through the float32 logits and the sampler (what
``PDSERVE_CPU_GREEDY_HEAD=0`` runs). Alternating in one process keeps the VM's drift out of the
ratio (a process-against-process A/B of the whole step, ``decode_steps.py``, measured rounds
34-45 ms apart). Then the lm_head alone on the step's own hidden states (the last step's rows,
captured): ``greedy`` against ``linear`` then ``argmax``, alternating calls. Prints medians and
the ratio; needs kernels that run the greedy head (an AVX2 or AVX-512 build).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.workloads import default_model_dir, ensure_model_folder

PROMPT, BLOCK = (32, 500), 6


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", type=Path, default=None)
    parser.add_argument("--seqs", type=int, default=18)
    parser.add_argument("--blocks", type=int, default=24, help="blocks of 6 steps, alternating")
    args = parser.parse_args(argv)
    if args.blocks < 2:
        parser.error("--blocks must be at least 2 (one of each)")
    folder = args.model_dir or default_model_dir("smollm2-135m")
    if args.model_dir is None:
        ensure_model_folder(folder)

    from engine.engine_config import EngineConfig
    from engine.llm_engine import LLMEngine
    from engine.sampling_params import SamplingParams

    engine = LLMEngine(EngineConfig(model=str(folder), dtype="float32"))
    runner, model = engine.runner, engine.runner.model
    if not model.has_greedy_head:
        raise SystemExit("no greedy head here (no AVX2 or AVX-512 build, or it is turned off)")
    head_path = runner._sample
    rows_seen: list[Any] = []

    def logits_path(hidden: Any, rows: Any) -> Any:
        rows_seen[:] = [hidden]
        return runner.sampler.sample(model.compute_logits(hidden), rows)

    rng = random.Random(0)
    vocab = model.config.vocab_size
    steps = 2 * args.blocks * BLOCK
    params = SamplingParams(temperature=0.0, max_tokens=steps + 50, ignore_eos=True)
    for i in range(args.seqs):
        prompt = [rng.randrange(10, vocab) for _ in range(rng.randint(*PROMPT))]
        engine.add_request(f"r{i}", prompt_token_ids=prompt, sampling_params=params)

    def prefilling() -> bool:
        running = engine.scheduler.running
        return any(r.num_computed_tokens < r.num_prompt_tokens for r in running)

    while engine.scheduler.waiting or prefilling():
        engine.step()
    times: dict[str, list[float]] = {"greedy head": [], "float32 logits": []}
    for block in range(args.blocks):
        name = "greedy head" if block % 2 == 0 else "float32 logits"
        runner._sample = head_path if block % 2 == 0 else logits_path  # type: ignore[method-assign]
        for _ in range(BLOCK):
            t = time.perf_counter()
            engine.step()
            times[name].append(time.perf_counter() - t)
    runner._sample = head_path  # type: ignore[method-assign]
    assert len(engine.scheduler.running) == args.seqs, "a request finished inside the timed steps"

    from engine.models.greedy_head import GreedyLmHead

    hidden = rows_seen[0]
    head = model.lm_head
    assert isinstance(head, GreedyLmHead)
    ops = head.kernels
    calls: dict[str, list[float]] = {"greedy": [], "linear + argmax": []}
    for i in range(80):
        t = time.perf_counter()
        if i % 2 == 0:
            head.greedy(hidden)
        else:
            ops.argmax(head(hidden))
        calls["greedy" if i % 2 == 0 else "linear + argmax"].append(time.perf_counter() - t)

    result = {name: statistics.median(v) for name, v in {**times, **calls}.items()}
    step_on, step_off = result["greedy head"], result["float32 logits"]
    print(f"greedy head's screen: {model.lm_head.screen_kind}")
    print(f"decode step of {args.seqs} requests, {args.blocks} alternating blocks of {BLOCK}:")
    print(f"  greedy head {step_on * 1e3:6.2f} ms | float32 logits {step_off * 1e3:6.2f} ms")
    print(f"  float32 logits / greedy head: x{step_off / step_on:.3f}")
    on, off = result["greedy"], result["linear + argmax"]
    print(f"lm_head alone on the step's {hidden.shape[0]} rows (median of 40 calls each):")
    print(f"  greedy {on * 1e3:6.2f} ms | linear + argmax {off * 1e3:6.2f} ms | x{off / on:.2f}")
    return result


if __name__ == "__main__":
    main()
