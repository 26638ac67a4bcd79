"""Structured-output cost on this CPU, two ways, printed side by side:

1. ``--mask``: per-token mask cost of the grammar engines on the model's tokenizer (fill the
   next-token bitmask, then consume a token allowed by it), llguidance and — when installed —
   xgrammar, over the same JSON schema walk; the median microseconds per token.
2. ``--engine`` (default): decode-step time of the engine (demo model, fp32) with and without
   a JSON schema on every request, at batch 1 and 32: the median ms per step and per token,
   and the overhead ratio. Steps that still hold a prefill are left out.

    python benchmarks/structured_overhead.py --mask --engine
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 4},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
# Long-running constraint for the engine runs: a JSON array of small integers, unbounded, so
# a request decodes its whole max_tokens under the grammar like the free-text baseline.
LONG_SCHEMA = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}}


def _allowed(mask: Any, vocab: int) -> list[int]:
    row = mask[0].tolist()
    return [i for i in range(vocab) if (row[i // 32] >> (i % 32)) & 1]


def mask_costs(tokenizer_path: str, steps: int = 64) -> dict[str, float]:
    from transformers import AutoTokenizer

    hf: Any = AutoTokenizer.from_pretrained(tokenizer_path)
    vocab = len(hf)
    out: dict[str, float] = {"vocab": float(vocab)}
    import llguidance
    import llguidance.hf
    import llguidance.torch as lt

    tok = llguidance.hf.from_tokenizer(hf)
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA)
    times: list[float] = []
    for seed in range(8):
        rng = random.Random(seed)
        m = llguidance.LLMatcher(tok, grammar)
        mask = lt.allocate_token_bitmask(1, tok.vocab_size)
        for _ in range(steps):
            if m.is_stopped():
                break
            t0 = time.perf_counter()
            lt.fill_next_token_bitmask(m, mask, 0)
            times.append(time.perf_counter() - t0)
            allowed = _allowed(mask, tok.vocab_size)
            if not allowed or not m.consume_token(rng.choice(allowed)):
                break
    out["llguidance_us"] = statistics.median(times) * 1e6
    try:
        import xgrammar as xgr
    except ImportError:
        return out
    info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab)
    compiled = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(SCHEMA))
    times = []
    for seed in range(8):
        rng = random.Random(seed)
        xm = xgr.GrammarMatcher(compiled)
        bitmask = xgr.allocate_token_bitmask(1, vocab)
        for _ in range(steps):
            if xm.is_terminated():
                break
            t0 = time.perf_counter()
            xm.fill_next_token_bitmask(bitmask)
            times.append(time.perf_counter() - t0)
            allowed = _allowed(bitmask, vocab)
            if not allowed or not xm.accept_token(rng.choice(allowed)):
                break
    out["xgrammar_us"] = statistics.median(times) * 1e6
    return out


def engine_step_times(batch: int, structured: bool, max_tokens: int = 48) -> tuple[float, float]:
    """Median ms of a whole decode step and of its sampling part (where the grammar work
    is: mask fill, mask apply, matcher advance)."""
    from engine.engine_config import EngineConfig
    from engine.llm_engine import LLMEngine
    from engine.sampling_params import SamplingParams
    from engine.structured.spec import StructuredOutput

    engine = LLMEngine(EngineConfig(dtype="float32", num_kv_blocks=1024, max_num_seqs=64))
    spec = StructuredOutput("json", json.dumps(LONG_SCHEMA)) if structured else None
    for i in range(batch):
        params = SamplingParams(
            temperature=1.0, seed=i, max_tokens=max_tokens, ignore_eos=not structured,
            structured=spec,
        )  # fmt: skip
        engine.add_request(f"r{i}", prompt_token_ids=[5 + i % 50] * 32, sampling_params=params)
    sampler = engine.runner.sampler
    sample = sampler.sample
    last_sample = [0.0]

    def timed_sample(logits: Any, rows: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return sample(logits, rows)
        finally:
            last_sample[0] = time.perf_counter() - t0

    sampler.sample = timed_sample  # type: ignore[method-assign]
    times: list[float] = []
    sample_times: list[float] = []
    while engine.has_unfinished_requests():
        decoding = (
            all(r.num_computed_tokens >= r.num_prompt_tokens for r in engine.scheduler.running)
            and len(engine.scheduler.running) == batch
        )
        t0 = time.perf_counter()
        engine.step()
        if decoding:
            times.append(time.perf_counter() - t0)
            sample_times.append(last_sample[0])
    return statistics.median(times) * 1e3, statistics.median(sample_times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mask", action="store_true")
    ap.add_argument("--engine", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    if not a.mask and not a.engine:
        a.engine = True
    if a.mask:
        from engine.demo_model import demo_model_path

        costs = mask_costs(str(demo_model_path()))
        print(f"mask cost per token (vocab {int(costs['vocab'])}):")
        for k in ("llguidance_us", "xgrammar_us"):
            if k in costs:
                print(f"  {k[:-3]:<11} {costs[k]:8.1f} us")
    if a.engine:
        print("decode step, median ms, free vs JSON schema (runs interleaved):")
        print("  batch | step free  step schema | per token free  schema | sampling free  schema")
        for batch in (1, 32):
            runs: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
            for _ in range(a.repeats):
                for structured in (False, True):
                    runs[structured].append(engine_step_times(batch, structured))
            step = {k: statistics.median(r[0] for r in v) for k, v in runs.items()}
            samp = {k: statistics.median(r[1] for r in v) for k, v in runs.items()}
            print(
                f"  {batch:>5} | {step[False]:9.2f}  {step[True]:11.2f} | "
                f"{step[False] / batch:14.3f}  {step[True] / batch:6.3f} | "
                f"{samp[False]:13.3f}  {samp[True]:6.3f}"
            )
            print(
                f"        sampling overhead {samp[True] - samp[False]:+.3f} ms/step = "
                f"{(samp[True] - samp[False]) / batch:+.4f} ms/token"
            )


if __name__ == "__main__":
    main()
