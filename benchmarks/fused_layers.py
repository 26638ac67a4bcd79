"""The decoder layers in one compiled call a step against the per-kernel Python layer, A/B.

    python benchmarks/fused_layers.py [--num-requests 32] [--rounds 3]

Runs the offline-throughput workload (same seed, same model folder) through pdserve's ``LLM``
on the CPU kernels and flips ``LlamaForCausalLM.fused_layers`` before every engine step, so
neighbouring steps (same batch, one token apart) run the two paths: the machine's drift hits
both alike. Both paths run the same kernels in the same order (the same bits: the generated
tokens of every round are compared with the first round's, which alternates the other way
round). Prints, for decode-only steps, the median step time of each path and the median of
the ratios of neighbouring pairs.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.workloads import DEFAULT_MODEL_DIR, ensure_model_folder, make_workload, model_shape


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    args = p.parse_args(argv)

    from pdserve import LLM, SamplingParams

    shape = model_shape()
    llm = LLM(model=str(ensure_model_folder(args.model_dir)), dtype="float32")
    model = llm.engine.runner.model
    if not model.fused_layers:
        print(
            "the fused decoder layers are not in use (no CPU kernels, not float32, or "
            "PDSERVE_FUSED_LAYERS=0)",
            file=sys.stderr,
        )
        return 1
    requests = make_workload(args.num_requests, (32, 512), (16, 256), shape.vocab_size, args.seed)
    prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in requests]
    params = [
        SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True) for r in requests
    ]
    engine = llm.engine
    step = engine.step
    # per step: (fused, decode-only, seconds)
    records: list[tuple[bool, bool, float]] = []
    state = {"fused": True}

    schedule = engine.scheduler.schedule
    last: dict[str, Any] = {}

    def remember_schedule() -> Any:
        last["out"] = out = schedule()
        return out

    def alternating_step() -> Any:
        last.clear()
        model.fused_layers = state["fused"]
        t0 = time.perf_counter()
        result = step()
        dt = time.perf_counter() - t0
        out = last.get("out")
        decode = out is not None and 0 < len(out.scheduled) == out.num_scheduled_tokens
        records.append((state["fused"], decode, dt))
        state["fused"] = not state["fused"]
        return result

    setattr(engine.scheduler, "schedule", remember_schedule)  # noqa: B010 (a method)
    setattr(engine, "step", alternating_step)  # noqa: B010
    reference: list[list[int]] | None = None
    pairs: list[float] = []
    fused_ms: list[float] = []
    plain_ms: list[float] = []
    for r in range(args.rounds):
        records.clear()
        state["fused"] = r % 2 == 1  # round 0 starts on the Python layer
        outs = llm.generate(prompts, params)
        tokens = [list(o.token_ids) for o in outs]
        if reference is None:
            reference = tokens
        same = sum(a == b for a, b in zip(tokens, reference, strict=True))
        dec = [(f, t) for f, d, t in records if d]
        for (f1, t1), (f2, t2) in itertools.pairwise(dec):
            if f1 and not f2:
                pairs.append(t2 / t1)
        fused_ms += [t * 1e3 for f, t in dec if f]
        plain_ms += [t * 1e3 for f, t in dec if not f]
        print(
            f"round {r + 1}: {len(dec)} decode steps; generated tokens {same}/{len(tokens)} "
            "identical to round 1"
        )
    print(
        f"decode-only steps, median: fused {statistics.median(fused_ms):.1f} ms, "
        f"per-kernel Python layer {statistics.median(plain_ms):.1f} ms; median ratio of "
        f"neighbouring steps (Python / fused) {statistics.median(pairs):.3f} over {len(pairs)} "
        "pairs"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
