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


def _cmd_serve(a: argparse.Namespace) -> int:
    if not a.colocated:
        # Router + prefill + decode processes over kv_transfer land with the services.
        print(
            "error: disaggregated mode: not available yet; run `pdserve serve --colocated`",
            file=sys.stderr,
        )
        return 2
    import asyncio

    from engine.engine_config import EngineConfig
    from router.local_backend import LocalEngineBackend
    from router.server import ServerOptions, serve_router

    options = ServerOptions(
        host=a.host,
        grpc_port=a.grpc_port,
        http_port=a.http_port,
        max_queue=a.max_queue,
        retry_after_s=a.retry_after_s,
        shutdown_grace_s=a.shutdown_grace_s,
    )
    try:
        if options.max_queue < 1:
            raise ValueError(f"--max-queue must be at least 1, got {options.max_queue}")
        config = EngineConfig(model=a.model, **engine_options(a))
        backend = LocalEngineBackend(config, served_model_name=a.served_model_name)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    def ready(grpc_address: str, http_url: str) -> None:
        print(f"pdserve: serving {backend.model_info().model!r} (colocated)", flush=True)
        print(f"pdserve: gRPC {grpc_address}", flush=True)
        print(f"pdserve: HTTP {http_url}", flush=True)

    try:
        asyncio.run(serve_router(backend, options, ready))
    except OSError as e:  # a port in use
        print(f"error: {e}", file=sys.stderr)
        return 1
    print("pdserve: stopped", flush=True)
    return 0


def _add_serve_parser(sub: Any) -> None:
    serve = sub.add_parser(
        "serve",
        help="serve gRPC and OpenAI-compatible HTTP APIs",
        description="Serve the model over gRPC and OpenAI-compatible HTTP until Ctrl-C/SIGTERM.",
    )
    mode = serve.add_argument_group("mode")
    mode.add_argument(
        "--colocated",
        action="store_true",
        help="one engine in the router process doing prefill and decode "
        "(without it: router + prefill + decode processes, not available yet)",
    )
    api = serve.add_argument_group("router")
    api.add_argument("--host", default="127.0.0.1", help="address both servers listen on")
    api.add_argument("--grpc-port", type=int, default=50051, help="0 = any free port")
    api.add_argument("--http-port", type=int, default=8000, help="0 = any free port")
    api.add_argument(
        "--max-queue",
        type=int,
        default=256,
        help="requests in flight before new ones get HTTP 429 / RESOURCE_EXHAUSTED",
    )
    api.add_argument("--retry-after-s", type=float, default=1.0, help="retry hint when busy")
    api.add_argument("--served-model-name", default=None, help="default: the model folder name")
    api.add_argument("--shutdown-grace-s", type=float, default=5.0)
    add_engine_args(serve)
    serve.set_defaults(func=_cmd_serve, scheduling_policy="priority")


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
    _add_serve_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
