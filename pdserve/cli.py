"""The ``pdserve`` command line."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any


def add_engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--model", default=None, help="Hugging Face model folder (default: demo model)")
    g.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16")
    g.add_argument("--device", default="auto", help="auto | cpu | cuda[:N]")
    g.add_argument("--attention-backend", default=None, choices=["torch", "triton"])
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--num-kv-blocks", type=int, default=None)
    g.add_argument("--kv-cache-memory-gb", type=float, default=1.0)
    g.add_argument("--swap-space-gb", type=float, default=0.5)
    g.add_argument("--no-prefix-caching", action="store_true")
    g.add_argument("--max-num-seqs", type=int, default=128)
    g.add_argument("--max-num-batched-tokens", type=int, default=2048)
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--no-chunked-prefill", action="store_true")
    g.add_argument("--scheduling-policy", default="fcfs", choices=["fcfs", "priority"])
    g.add_argument("--preemption-mode", default="auto", choices=["auto", "swap", "recompute"])
    g.add_argument("--seed", type=int, default=0)


def engine_options(a: argparse.Namespace) -> dict[str, Any]:
    return dict(
        dtype=a.dtype,
        device=a.device,
        attention_backend=a.attention_backend,
        block_size=a.block_size,
        num_kv_blocks=a.num_kv_blocks,
        kv_cache_memory_gb=a.kv_cache_memory_gb,
        swap_space_gb=a.swap_space_gb,
        enable_prefix_caching=not a.no_prefix_caching,
        max_num_seqs=a.max_num_seqs,
        max_num_batched_tokens=a.max_num_batched_tokens,
        max_model_len=a.max_model_len,
        enable_chunked_prefill=not a.no_chunked_prefill,
        scheduling_policy=a.scheduling_policy,
        preemption_mode=a.preemption_mode,
        seed=a.seed,
    )


def _cmd_generate(a: argparse.Namespace) -> int:
    from pdserve import LLM, SamplingParams

    try:
        params = SamplingParams(
            max_tokens=a.max_tokens,
            temperature=a.temperature,
            top_k=a.top_k,
            top_p=a.top_p,
            seed=a.sampling_seed,
            stop=tuple(a.stop or ()),
            ignore_eos=a.ignore_eos,
            logprobs=a.logprobs,
        )
        llm = LLM(a.model, **engine_options(a))
        outputs = llm.generate(list(a.prompt), params)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for out in outputs:
        if a.json:
            print(
                json.dumps(
                    {
                        "prompt": out.prompt,
                        "text": out.text,
                        "token_ids": out.token_ids,
                        "finish_reason": out.finish_reason,
                        "num_prompt_tokens": len(out.prompt_token_ids),
                    }
                )
            )
        else:
            print(f"{out.prompt!r} -> {out.text!r} [{out.finish_reason}]")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pdserve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate text offline for one or more prompts")
    gen.add_argument("--prompt", action="append", required=True, help="repeat for a batch")
    gen.add_argument("--max-tokens", type=int, default=32)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--sampling-seed", type=int, default=None)
    gen.add_argument("--stop", action="append")
    gen.add_argument("--ignore-eos", action="store_true")
    gen.add_argument("--logprobs", type=int, default=None)
    gen.add_argument("--json", action="store_true", help="one JSON object per prompt")
    add_engine_args(gen)
    gen.set_defaults(func=_cmd_generate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
