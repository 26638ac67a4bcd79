"""Where pdserve's offline step time goes, on the offline-throughput workload.

    python benchmarks/profile_pdserve.py [--num-requests 32] [--op-profile-steps 20]

Runs the benchmark workload (same seed, same model folder) through pdserve's ``LLM`` once,
timing every engine step and, inside it, the pieces, with ``perf_counter`` wrappers put on the
engine's objects at run time (no engine code changes; about a microsecond per wrapped call):

    step = schedule + execute + update/outputs
    execute = prepare inputs + forward + lm_head + sampling (lm_head: the greedy head's call
              for greedy rows where it runs, engine/models/greedy_head.py)
    forward = GEMMs in the decoder layers (every nn.Linear or PackedLinear but lm_head) +
              attention (backend.forward: KV store, then the cpu backend's paged attention or
              the torch backend's gather + SDPA) + the rest (embedding, norms, rope,
              activation, residual adds)

``PDSERVE_CPU_KERNELS=0`` in the environment profiles the torch path instead. The decoder
layers run the per-kernel Python layer here (``PDSERVE_FUSED_LAYERS=0`` unless the environment
says otherwise), whose Python-side timers see each kernel. ``--fused`` profiles the product's
fused layers instead (one compiled call a step): the kernels' own phase timers
(``PDSERVE_CPU_PHASE_TIMERS=1``, kernels/cpu/phase_timers.h) say what its GEMMs, KV store,
attention and pointwise ops took.

Steps are split into those that carry prefill tokens and pure decode steps. With
``--op-profile-steps N`` a second pass runs ``torch.profiler`` over N steps in the middle of the
run and prints the top ops by self CPU time (that splits attention into its ops).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.workloads import (
    add_checkpoint_dtype,
    default_model_dir,
    ensure_model_folder,
    make_workload,
    model_shape,
    workload_flops,
)


class Timers:
    """Accumulated seconds per label, plus per-step records."""

    def __init__(self) -> None:
        self.total: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, obj: Any, attr: str, label: str) -> None:
        fn: Callable[..., Any] = getattr(obj, attr)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.total[label] += time.perf_counter() - t0
                self.calls[label] += 1

        setattr(obj, attr, timed)

    def hook_module(self, module: Any, label: str) -> None:
        start: list[float] = []

        def pre(_m: Any, _inputs: Any) -> None:
            start.append(time.perf_counter())

        def post(_m: Any, _inputs: Any, _output: Any) -> None:
            self.total[label] += time.perf_counter() - start.pop()
            self.calls[label] += 1

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)


PHASE_GROUPS = {"gemm": ("qkv", "o", "gate_up", "down"), "attention": ("store_kv", "attention")}


def instrument(llm: Any, timers: Timers, phases: Any = None) -> list[dict[str, float]]:
    """Put timers on the engine's pieces; return the list that per-step records go into.
    ``phases``: the compiled kernels' ``phase_times`` when the decoder layers run fused (each
    step then reads the time its layers spent per phase, and charges their GEMMs and attention
    as the per-kernel layer's timers would)."""
    import torch.nn as nn

    from engine.models.layers import PackedLinear

    engine = llm.engine
    runner = engine.runner
    model = runner.model
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear | PackedLinear):
            timers.hook_module(module, "lm_head" if name == "lm_head" else "gemm")
    timers.wrap(engine.scheduler, "schedule", "schedule")
    timers.wrap(engine.scheduler, "update_from_output", "update")
    timers.wrap(engine, "_make_output", "outputs")
    timers.wrap(runner, "_prepare_inputs", "prepare_inputs")
    timers.wrap(runner.backend, "prepare", "prepare_inputs")
    timers.wrap(runner.backend, "forward", "attention")
    if hasattr(model.lm_head, "greedy"):  # the greedy head: greedy rows' lm_head and argmax
        timers.wrap(model.lm_head, "greedy", "lm_head")
    timers.wrap(runner.sampler, "sample", "sampling")
    timers.wrap(model, "forward", "forward")

    steps: list[dict[str, float]] = []
    schedule = engine.scheduler.schedule
    step = engine.step
    last: dict[str, Any] = {}

    def remember_schedule() -> Any:
        out = schedule()
        last["out"] = out
        return out

    def timed_step() -> Any:
        before = dict(timers.total)
        t0 = time.perf_counter()
        result = step()
        wall = time.perf_counter() - t0
        out = last.get("out")
        num_seqs = len(out.scheduled) if out is not None else 0
        num_tokens = out.num_scheduled_tokens if out is not None else 0
        # Key positions the step's attention reads: every scheduled request's whole context.
        keys = (
            sum(r.num_computed_tokens + r.num_scheduled_tokens for r in out.scheduled) if out else 0
        )
        record = {k: timers.total[k] - before.get(k, 0.0) for k in timers.total}
        # Rows whose hidden state the step samples (the last layer runs the others' K/V alone).
        sampled = sum(1 for r in out.scheduled if r.sample) if out else 0
        record.update(
            wall=wall, num_seqs=num_seqs, num_tokens=num_tokens, keys=keys, sampled=sampled
        )
        if phases is not None:
            names, seconds = phases(True)
            by_name = dict(zip(names, seconds, strict=True))
            for label, members in PHASE_GROUPS.items():
                record[label] = record.get(label, 0.0) + sum(by_name[m] for m in members)
            record.update({f"phase:{n}": v for n, v in by_name.items()})
        steps.append(record)
        return result

    engine.scheduler.schedule = remember_schedule
    engine.step = timed_step
    return steps


def report(steps: list[dict[str, float]], wall_s: float, floors: dict[str, float]) -> None:
    """Per group of steps, where the time goes; for decode steps also attention against the
    time to read its KV once and the GEMMs against streaming their weights once, both at the
    read bandwidth ``floors['read_gbps']`` measured in the same run, and the GEMMs' rate against
    the FMA peak ``floors['fma_gflops']`` (0: not measured)."""
    groups = {
        "prefill+decode steps": [s for s in steps if s["num_tokens"] > s["num_seqs"]],
        "decode-only steps": [s for s in steps if 0 < s["num_tokens"] == s["num_seqs"]],
    }
    labels = [
        ("schedule", "scheduler.schedule"),
        ("prepare_inputs", "prepare inputs (runner + backend.prepare)"),
        ("gemm", "GEMMs in decoder layers (qkv, o, gate_up, down)"),
        ("attention", "attention (KV store + attention)"),
        ("forward_rest", "rest of forward (embed, norms, rope, act, adds)"),
        ("lm_head", "lm_head"),
        ("sampling", "sampling"),
        ("update", "scheduler.update_from_output"),
        ("outputs", "outputs + detokenize"),
        ("unaccounted", "unaccounted (step glue)"),
    ]
    in_steps = sum(s["wall"] for s in steps)
    bw = floors["read_gbps"] * 1e9
    gemm_ms = floors["layer_weight_bytes"] / bw * 1e3  # streaming the layers' weights once
    print(f"\nwall {wall_s:.1f} s, {len(steps)} steps, {in_steps:.1f} s inside engine.step")
    for name, group in groups.items():
        if not group:
            continue
        sums: dict[str, float] = defaultdict(float)
        for s in group:
            for k, v in s.items():
                sums[k] += v
        sums["forward_rest"] = sums["forward"] - sums["gemm"] - sums["attention"]
        accounted = sum(sums[k] for k, _ in labels if k != "unaccounted")
        sums["unaccounted"] = sums["wall"] - accounted
        n = len(group)
        print(
            f"\n{name}: {n} steps, {sums['wall']:.1f} s ({sums['wall'] / n * 1e3:.1f} ms/step), "
            f"{sums['num_tokens'] / n:.1f} tokens and {sums['num_seqs'] / n:.1f} requests per step"
        )
        for key, text in labels:
            print(
                f"  {text:<50} {sums[key]:>7.2f} s {sums[key] / sums['wall']:>6.1%}"
                f" {sums[key] / n * 1e3:>8.2f} ms/step"
            )
        if name == "decode-only steps":
            kv_ms = sums["keys"] / n * floors["kv_bytes_per_position"] / bw * 1e3
            att_ms = sums["attention"] / n * 1e3
            mm_ms = sums["gemm"] / n * 1e3
            print(
                f"  at {floors['read_gbps']:.1f} GB/s read bandwidth (measured in this run): "
                f"attention {att_ms:.1f} ms vs reading its KV once ({sums['keys'] / n:,.0f} "
                f"positions) {kv_ms:.1f} ms = {att_ms / kv_ms:.2f}x; decoder GEMMs {mm_ms:.1f} "
                f"ms vs streaming their weights once "
                f"({floors['layer_weight_bytes'] / 1e6:.0f} MB) {gemm_ms:.1f} ms = "
                f"{mm_ms / gemm_ms:.2f}x"
            )
        inside = {k[len("phase:") :]: v for k, v in sums.items() if k.startswith("phase:")}
        if inside:
            cells = ", ".join(f"{k} {v / n * 1e3:.2f}" for k, v in inside.items())
            print(f"  inside the fused decoder layers, ms/step: {cells}")
        peak = floors.get("fma_gflops")
        if peak and sums["gemm"] > 0:
            rows = sums["num_tokens"] / n
            unsampled = (sums["num_tokens"] - sums["sampled"]) / n
            gflop = 2.0 * (floors["layer_params"] * rows - floors["last_skip"] * unsampled) / 1e9
            mm_ms = sums["gemm"] / n * 1e3
            line = (
                f"  decoder GEMMs: {gflop:.2f} GFLOP a step at {rows:.1f} rows, "
                f"{gflop / mm_ms * 1e3:.1f} GFLOP/s = {gflop / mm_ms * 1e3 / peak:.0%} of "
                f"the FMA peak ({peak:.1f} GFLOP/s, benchmarks/fma_peak.py)"
            )
            if name == "decode-only steps":
                at_peak_ms = gflop / peak * 1e3
                line += (
                    f"; at that peak {at_peak_ms:.1f} ms = {at_peak_ms / gemm_ms:.2f}x streaming "
                    "their weights (the least any fp32 kernel reaches)"
                )
            print(line)


def op_profile(llm: Any, run: Callable[[], int], num_steps: int, skip: int, top: int) -> None:
    from torch.profiler import ProfilerActivity, profile, schedule

    engine = llm.engine
    step = engine.step
    sched = schedule(wait=skip, warmup=2, active=num_steps, repeat=1)
    with profile(activities=[ProfilerActivity.CPU], schedule=sched) as prof:

        def profiled_step() -> Any:
            result = step()
            prof.step()
            return result

        engine.step = profiled_step
        run()
        engine.step = step
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    print(f"\ntorch.profiler over {num_steps} steps after step {skip}: top ops by self CPU time")
    print(f"{'op':<56} {'calls':>7} {'self ms':>9} {'share':>7}")
    for e in sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]:
        print(
            f"{e.key[:56]:<56} {e.count:>7} {e.self_cpu_time_total / 1e3:>9.1f} "
            f"{e.self_cpu_time_total / total:>7.1%}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model-dir", type=Path, default=None, help="default: by the next")
    add_checkpoint_dtype(parser, "; on a bf16 checkpoint pdserve packs its weights as bf16")
    parser.add_argument("--max-num-seqs", type=int, default=None, help="default: pdserve's")
    parser.add_argument(
        "--max-num-batched-tokens", type=int, default=None, help="default: pdserve's"
    )
    parser.add_argument("--block-size", type=int, default=None, help="default: pdserve's")
    parser.add_argument("--op-profile-steps", type=int, default=0, help="0: skip torch.profiler")
    parser.add_argument("--op-profile-skip", type=int, default=100, help="steps before it starts")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument(
        "--fused",
        action="store_true",
        help="profile the product's fused decoder layers (timed inside by the kernels' "
        "phase timers, PDSERVE_CPU_PHASE_TIMERS=1) instead of the per-kernel Python layer",
    )
    args = parser.parse_args()

    import os

    import torch

    from pdserve import LLM, SamplingParams

    if args.fused:
        os.environ["PDSERVE_FUSED_LAYERS"] = "1"
        os.environ["PDSERVE_CPU_PHASE_TIMERS"] = "1"  # read by the kernels at their first layer
    else:
        os.environ.setdefault("PDSERVE_FUSED_LAYERS", "0")  # the timers see each kernel
    shape = model_shape()
    model_dir = ensure_model_folder(
        args.model_dir or default_model_dir("smollm2-135m", args.checkpoint_dtype),
        checkpoint_dtype=args.checkpoint_dtype,
    )
    requests = make_workload(args.num_requests, (32, 512), (16, 256), shape.vocab_size, args.seed)
    warmup = make_workload(2, (32, 64), (4, 8), shape.vocab_size, args.seed + 1_000_003)
    options = {
        k: v
        for k, v in (
            ("max_num_seqs", args.max_num_seqs),
            ("max_num_batched_tokens", args.max_num_batched_tokens),
            ("block_size", args.block_size),
        )
        if v is not None
    }
    llm = LLM(model=str(model_dir), dtype="float32", **options)
    model = llm.engine.runner.model
    kernels_on = model.kernels is not None
    print(
        f"attention backend {llm.engine.backend.name}, CPU kernels {kernels_on}, decoder layers "
        f"{'fused (one compiled call a step)' if model.fused_layers else 'per kernel (Python)'}"
    )
    if args.fused and not model.fused_layers:
        raise SystemExit("--fused: this model's layers do not run fused here")

    def run_requests(reqs: list[Any]) -> int:
        prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in reqs]
        params = [
            SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True) for r in reqs
        ]
        return sum(len(o.token_ids) for o in llm.generate(prompts, params))

    run_requests(warmup)
    timers = Timers()
    steps = instrument(llm, timers, model.kernels.phase_times if args.fused else None)
    t0 = time.perf_counter()
    num_output = run_requests(requests)
    wall_s = time.perf_counter() - t0
    flops = workload_flops(requests, shape)["total"]
    print(
        f"{args.num_requests} requests, {num_output} output tokens in {wall_s:.1f} s: "
        f"{num_output / wall_s:.1f} tok/s, {flops / wall_s / 1e9:.1f} GFLOP/s of useful "
        f"matmul work (torch threads {torch.get_num_threads()}, timers on)"
    )
    from benchmarks.floor import BYTES_PER_PARAM, kv_bytes_per_position
    from benchmarks.fma_peak import measure_fma_peak
    from benchmarks.roofline import measure_read_bandwidth

    floors = {
        "read_gbps": measure_read_bandwidth(),
        "kv_bytes_per_position": kv_bytes_per_position(shape),
        "layer_weight_bytes": layer_weight_bytes(model)
        or BYTES_PER_PARAM * shape.params_in_linear_layers,
        "layer_params": shape.params_in_linear_layers,
        "last_skip": shape.last_layer_unsampled_skip,
        "fma_gflops": measure_fma_peak(torch.get_num_threads()) or 0.0,
    }
    print(
        "decoder layers' weights as the step reads them: "
        f"{floors['layer_weight_bytes'] / 1e6:.0f} MB"
    )
    report(steps, wall_s, floors)
    if args.op_profile_steps:
        op_profile(
            llm,
            lambda: run_requests(requests),
            args.op_profile_steps,
            args.op_profile_skip,
            args.top,
        )


def layer_weight_bytes(model: Any) -> int:
    """Bytes of the decoder layers' packed weights (float32 or bf16 panels), 0 when none are
    packed (the torch path)."""
    from engine.models.layers import PackedLinear

    return sum(
        m.packed.numel() * m.packed.element_size()
        for m in model.layers.modules()
        if isinstance(m, PackedLinear)
    )


if __name__ == "__main__":
    main()
