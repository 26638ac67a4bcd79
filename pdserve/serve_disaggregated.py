"""``pdserve serve`` in disaggregated mode and ``pdserve router``: the router's backend over
its workers, and the workers ``pdserve serve`` starts.

    pdserve serve [--prefill-workers N] [--decode-workers M] [--redis-url URL | --redis auto]
        N prefill + M decode worker processes (children; stopped on exit), the router here.
        No Redis: the router lists them (static source, each polled over WorkerControl).
        With Redis: the workers register there and the router follows the registry; "auto"
        starts a local redis-server for the run (pdserve.local_redis).
    pdserve router --redis-url URL | --decode H:P ... --prefill H:P ...
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pdserve.options import config_to_argv, engine_config_from_args
from pdserve.ports import free_port

RunRouter = Callable[[argparse.Namespace, Any, str, Callable[[], None] | None], int]


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    """The router's routing and control-plane flags (``pdserve serve`` and ``pdserve router``)."""
    from router.routing import POLICY_NAMES

    g = p.add_argument_group("cluster")
    g.add_argument(
        "--routing-policy",
        default="kv_aware",
        choices=POLICY_NAMES,
        help="kv_aware: the (decode, prefill) pair with the least added work, counting what "
        "each worker caches (cluster KV index), with a share cap and local prefill when "
        "decode holds most of the prompt; least_loaded; round_robin",
    )
    g.add_argument(
        "--redis-url",
        default=None,
        help="follow the worker registry in this Redis (redis:// or rediss://); "
        "`pdserve serve --redis-url auto` starts a local redis-server",
    )
    g.add_argument("--redis-password-file", default=None, help="the Redis password, in a file")
    g.add_argument("--redis-ca-file", default=None, help="CA bundle for a rediss:// URL")
    g.add_argument("--cluster-name", default="default", help="the registry namespace")
    g.add_argument(
        "--local-prefill-hit-ratio",
        type=float,
        default=0.75,
        help="kv_aware: a decode worker that caches at least this share of the prompt "
        "prefills the rest itself instead of a prefill worker (above 1: never; "
        "docs/benchmarks.md measures it)",
    )


def make_backend(
    a: argparse.Namespace,
    model: str,
    decode: list[str],
    prefill: list[str],
    chat_template: str | None = None,
) -> Any:
    """The router's DisaggregatedBackend from its flags: Redis when ``--redis-url``, else the
    static ``decode``/``prefill`` lists. ``chat_template``: --chat-template, loaded
    (router.tokenizer_ops.load_chat_template)."""
    from pdserve.worker_control_args import redis_url_of
    from router.cluster_router import ClusterRouter
    from router.disaggregated_backend import DisaggregatedBackend, policy_options
    from router.routing import make_policy
    from router.security import RouterSecurity

    tls = RouterSecurity.from_args(a).worker_tls  # --worker-tls-*: mutual TLS to the workers
    url = redis_url_of(a)
    options = policy_options(a.routing_policy, a.local_prefill_max_tokens, a.block_size)
    if a.routing_policy == "kv_aware":
        options["local_prefill_hit_ratio"] = a.local_prefill_hit_ratio
    policy = make_policy(a.routing_policy, **options)
    if url:
        cluster = ClusterRouter.redis(
            url, a.cluster_name, policy, a.local_prefill_max_tokens, tls=tls
        )
    elif not decode or not prefill:
        raise ValueError("give --redis-url, or the workers with --decode and --prefill")
    else:
        cluster = ClusterRouter.static(decode, prefill, policy, a.local_prefill_max_tokens, tls=tls)
    return DisaggregatedBackend(
        model,
        decode,
        prefill,
        served_model_name=a.served_model_name,
        block_size=a.block_size,
        max_model_len=a.max_model_len,
        local_prefill_max_tokens=a.local_prefill_max_tokens,
        stall_timeout_s=a.stall_timeout_s,
        migration_limit=a.migration_limit,
        routing_policy=a.routing_policy,
        cluster=cluster,
        worker_tls=tls,
        chat_template=chat_template,
    )


def serve_disaggregated(a: argparse.Namespace, run_router: RunRouter) -> int:
    """Router in this process; ``--prefill-workers`` + ``--decode-workers`` child processes."""
    from engine.demo_model import demo_model_path
    from pdserve.launch import (
        check_nice,
        parse_cpus,
        serve_kv_transport,
        start_worker,
        stop_workers,
        terminate,
        wait_healthy,
    )
    from pdserve.launch_security import WorkerLaunchSecurity
    from router.tokenizer_ops import load_chat_template

    if a.prefill_workers < 1 or a.decode_workers < 1:
        print("error: --prefill-workers and --decode-workers must be at least 1", file=sys.stderr)
        return 2
    try:
        nice = {
            "decode": check_nice(a.decode_nice, "--decode-nice"),
            "prefill": check_nice(a.prefill_nice, "--prefill-nice"),
        }
        chat_template = load_chat_template(a.chat_template)  # before any worker starts
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    model = a.model or str(demo_model_path())  # build the demo once, before the children
    common = [
        *config_to_argv(engine_config_from_args(a), exclude=("model",)),
        "--shutdown-grace-s",
        str(a.shutdown_grace_s),
    ]
    if a.served_model_name:  # the workers' metrics label and fingerprint: the first name
        common += ["--served-model-name", a.served_model_name[0]]
    decode_cpus, prefill_cpus = parse_cpus(a.decode_cpus), parse_cpus(a.prefill_cpus)
    transport, why = serve_kv_transport(a.kv_transport, decode_cpus, prefill_cpus)
    if why:
        print(f"pdserve: {why}", file=sys.stderr)
    redis = None
    procs = []
    try:
        if a.redis_url == "auto":
            from pdserve.local_redis import RedisServer

            redis = RedisServer(Path(tempfile.mkdtemp(prefix="pdserve-redis-")))
            redis.start()
            a.redis_url = redis.url
            print(f"pdserve: control plane on a local redis-server at {redis.url}", flush=True)
        if a.redis_url:
            common += ["--redis-url", a.redis_url, "--cluster-name", a.cluster_name]
            for flag in ("redis_password_file", "redis_ca_file"):
                if getattr(a, flag):
                    common += [f"--{flag.replace('_', '-')}", getattr(a, flag)]
        security = WorkerLaunchSecurity.from_args(
            a, transport, lambda p: _port_or_free(a.worker_host, p), a.decode_workers
        )
        transport = security.transport
        targets: dict[str, list[str]] = {"decode": [], "prefill": []}
        for role, count, first_port, cpus, extra in (
            (
                "decode",
                a.decode_workers,
                a.decode_port,
                decode_cpus,
                ["--kv-transport", transport, "--kv-lease-s", str(a.kv_lease_s)],
            ),
            (
                "prefill",
                a.prefill_workers,
                a.prefill_port,
                prefill_cpus,
                ["--max-num-batched-tokens", str(a.prefill_max_num_batched_tokens)],
            ),
        ):
            metrics_port = a.decode_metrics_port if role == "decode" else a.prefill_metrics_port
            for i in range(count):
                port = _port_or_free(a.worker_host, first_port + i if first_port else 0)
                args = [*common, *extra, "--host", a.worker_host]
                args += security.decode_argv(i) if role == "decode" else security.prefill_argv()
                args += [
                    "--metrics-port",
                    str(metrics_port + i if metrics_port > 0 else metrics_port),
                ]
                procs.append(start_worker(role, model, port, args, cpus, nice[role]))
                targets[role].append(f"{a.worker_host}:{port}")
        for target, proc in zip([*targets["decode"], *targets["prefill"]], procs, strict=True):
            wait_healthy(target, proc, a.worker_start_timeout_s, security.router_tls)
        static = not a.redis_url
        backend = make_backend(
            a,
            model,
            targets["decode"] if static else [],
            targets["prefill"] if static else [],
            chat_template,
        )
        # On SIGTERM/Ctrl-C the router drains first (its requests finish on the workers);
        # then the workers, with nothing left in flight, stop alongside the router's servers.
        return run_router(a, backend, "disaggregated", lambda: terminate(procs))
    except (ValueError, FileNotFoundError, RuntimeError, TimeoutError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        stop_workers(procs, timeout_s=a.shutdown_grace_s + 1.0)  # idle: they stop at once
        if redis is not None:
            redis.stop()


def _port_or_free(host: str, port: int) -> int:
    return port or free_port(host)
