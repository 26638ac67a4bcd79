"""The ``pdserve`` command line."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

import pdserve
from pdserve.launch import DEFAULT_DECODE_NICE
from pdserve.options import add_engine_args, engine_config_from_args
from pdserve.router_args import add_router_args, router_options
from pdserve.serve_disaggregated import add_cluster_args


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
        config = engine_config_from_args(a)
        llm = LLM(**dataclasses.asdict(config))
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
    try:
        options = router_options(a)  # before loading the model or starting a worker
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not a.colocated:
        return _serve_disaggregated(a, options)
    from router.local_backend import LocalEngineBackend
    from router.tokenizer_ops import load_chat_template

    try:
        template = load_chat_template(a.chat_template)
        config = engine_config_from_args(a)
        backend = LocalEngineBackend(
            config, served_model_name=a.served_model_name, chat_template=template
        )
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return _run_router(a, backend, "colocated", options)


def _run_router(
    a: argparse.Namespace,
    backend: Any,
    mode: str,
    options: Any,
    on_drained: Callable[[], None] | None = None,
) -> int:
    """Serve ``backend`` with the router's ``options`` (``router_options(a)``) until stopped."""
    import asyncio

    from router.server import serve_router

    def ready(grpc_address: str, http_url: str) -> None:
        print(f"pdserve: serving {backend.model_info().model!r} ({mode})", flush=True)
        print(f"pdserve: gRPC {grpc_address}", flush=True)
        print(f"pdserve: HTTP {http_url}", flush=True)
        print(f"pdserve: metrics {http_url}/metrics", flush=True)

    try:
        metrics = _router_metrics(a, backend, mode)
        asyncio.run(serve_router(backend, options, ready, metrics, on_drained))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print("pdserve: stopped", flush=True)
    return 0


def _router_metrics(a: argparse.Namespace, backend: Any, mode: str) -> Any:
    """The router's metrics; colocated, the engine's own metrics join them."""
    from router.metrics import RouterMetrics

    def seconds(ms: float | None) -> float | None:
        return None if ms is None else ms / 1000.0

    role = "colocated" if mode == "colocated" else "router"
    model = backend.model_info().model
    metrics = RouterMetrics(role, model, seconds(a.slo_ttft_ms), seconds(a.slo_itl_ms))
    if mode == "colocated":
        from pdserve.metrics.build_info import engine_labels
        from pdserve.metrics.engine_collector import EngineCollector

        engine = backend.async_engine
        metrics.registry.register(EngineCollector(engine, role, model))
        metrics.build_info.add(engine_labels(engine))
        metrics.stages.add("prefill_queue", engine.metrics.queue_seconds)
        metrics.stages.add("prefill_compute", engine.metrics.prefill_seconds)
    cluster = getattr(backend, "cluster", None)
    if cluster is not None:
        from router.cluster_metrics import ClusterCollector

        metrics.registry.register(ClusterCollector(cluster, role, model))
    return metrics


def _serve_disaggregated(a: argparse.Namespace, options: Any) -> int:
    from pdserve.serve_disaggregated import serve_disaggregated

    return serve_disaggregated(
        a, lambda a, backend, mode, on_drained: _run_router(a, backend, mode, options, on_drained)
    )


def _cmd_router(a: argparse.Namespace) -> int:
    from engine.demo_model import demo_model_path
    from pdserve.serve_disaggregated import make_backend
    from router.tokenizer_ops import load_chat_template

    try:
        options = router_options(a)  # before dialling a worker
        template = load_chat_template(a.chat_template)
        backend = make_backend(a, a.model or str(demo_model_path()), a.decode, a.prefill, template)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return _run_router(a, backend, "router", options)


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
        "(default: router here + a prefill and a decode worker process)",
    )
    add_router_args(serve)
    add_cluster_args(serve)
    workers = serve.add_argument_group("workers (disaggregated mode)")
    workers.add_argument("--prefill-workers", type=int, default=1, help="prefill processes")
    workers.add_argument("--decode-workers", type=int, default=1, help="decode processes")
    workers.add_argument("--worker-host", default="127.0.0.1")
    workers.add_argument(
        "--decode-port", type=int, default=0, help="the first decode worker's (0 = any free)"
    )
    workers.add_argument(
        "--prefill-port", type=int, default=0, help="the first prefill worker's (0 = any free)"
    )
    workers.add_argument("--kv-transport", default="auto", help="auto (UCX if installed) | tcp")
    workers.add_argument("--prefill-max-num-batched-tokens", type=int, default=4096)
    workers.add_argument("--decode-cpus", default=None, help="pin decode, e.g. 1 (like taskset)")
    workers.add_argument("--prefill-cpus", default=None, help="pin prefill, e.g. 0")
    workers.add_argument(
        "--decode-nice",
        type=int,
        default=DEFAULT_DECODE_NICE,
        help="the decode workers' niceness, 0-19: where they share cores with the prefill "
        "workers, a higher value lets prompts take the CPU first (shorter TTFT, longer TPOT)",
    )
    workers.add_argument(
        "--prefill-nice", type=int, default=0, help="the prefill workers' niceness, 0-19"
    )
    workers.add_argument("--worker-start-timeout-s", type=float, default=300.0)
    workers.add_argument(
        "--kv-lease-s",
        type=float,
        default=10.0,
        help="decode releases a reservation prefill neither writes nor renews for this long",
    )
    workers.add_argument(
        "--decode-metrics-port", type=int, default=0, help="0 = any free port, -1 = off"
    )
    workers.add_argument(
        "--prefill-metrics-port", type=int, default=0, help="0 = any free port, -1 = off"
    )
    add_engine_args(serve)
    serve.set_defaults(func=_cmd_serve, scheduling_policy="priority")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pdserve", description=__doc__)
    parser.add_argument("--version", action="version", version=f"pdserve {pdserve.__version__}")
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
    router = sub.add_parser(
        "router", help="run the router over existing prefill and decode workers"
    )
    router.add_argument(
        "--decode", action="append", default=[], help="host:port, repeatable (no Redis)"
    )
    router.add_argument(
        "--prefill", action="append", default=[], help="host:port, repeatable (no Redis)"
    )
    router.add_argument("--model", default=None, help="model folder (for the tokenizer)")
    router.add_argument("--block-size", type=int, default=16)
    router.add_argument("--max-model-len", type=int, default=None)
    add_router_args(router)
    add_cluster_args(router)
    router.set_defaults(func=_cmd_router)
    sub.add_parser("prefill", help="run a prefill worker (see `pdserve prefill --help`)")
    sub.add_parser("decode", help="run a decode worker (see `pdserve decode --help`)")
    from pdserve.bench.cli import add_bench_parser

    add_bench_parser(sub)
    from pdserve.plan.cli import add_plan_parser, run_plan

    add_plan_parser(sub)
    sub.choices["plan"].set_defaults(func=run_plan)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    import logging

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("prefill", "decode"):  # the workers own their flags
        if argv[0] == "prefill":
            from prefill_service.server import main as worker_main
        else:
            from decode_service.server import main as worker_main
        return worker_main(argv[1:])
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    code = int(args.func(args))
    if args.command in ("serve", "router"):
        from pdserve.fast_exit import exit_now

        exit_now(code)  # stopped and drained (workers too): skip seconds of torch teardown
    return code


if __name__ == "__main__":
    sys.exit(main())
