"""Where a pdserve decode step's time goes on a GPU: host work against device work.

    python benchmarks/gpu_step_profile.py [--shape smollm2-135m] [--dtype float32] \\
        [--num-requests 32] [--steps 20]

Runs the offline benchmark's workload (same seed, same random model folder) through an
``LLMEngine`` on the default device until every request has finished its prompt, then times
``--steps`` pure decode steps (device synchronised around each) and runs ``torch.profiler`` over
as many more. Prints per step: wall milliseconds, the kernels launched and the summed time they
ran on the device, so ``device busy`` = kernel time / wall says how much of the step the GPU
works and how much it waits for Python to launch the next kernel; then the top ops by self CPU
time. On a CPU the same script runs (no kernels to count), which is how it is tested.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.offline_throughput import default_model_dir
from benchmarks.workloads import SHAPES, ensure_model_folder, make_workload, model_shape
from engine.engine_config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _all_decoding(engine: LLMEngine) -> bool:
    scheduler = engine.scheduler
    running = scheduler.running
    if len(scheduler.waiting) or not running:
        return False
    return all(r.num_computed_tokens >= r.num_prompt_tokens for r in running)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-135m")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--steps", type=int, default=20, help="timed steps, then as many profiled")
    p.add_argument("--model-dir", type=Path, default=None)
    args = p.parse_args(argv)

    folder = ensure_model_folder(args.model_dir or default_model_dir(args.shape), shape=args.shape)
    shape = model_shape(args.shape)
    # Outputs long enough that every request is still decoding through both measured windows.
    out_len = 3 * args.steps + 64
    requests = make_workload(args.num_requests, (32, 512), (out_len, out_len), shape.vocab_size, 0)
    engine = LLMEngine(EngineConfig(model=str(folder), dtype=args.dtype))
    device = engine.device
    for i, r in enumerate(requests):
        params = SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True)
        engine.add_request(f"r{i}", prompt_token_ids=r.prompt_token_ids, sampling_params=params)
    prefill_steps = 0
    while not _all_decoding(engine):
        engine.step()
        prefill_steps += 1
    for _ in range(3):  # warm-up decode steps: kernels compiled for this batch
        engine.step()

    walls = []
    for _ in range(args.steps):
        _sync(device)
        t0 = time.perf_counter()
        engine.step()
        _sync(device)
        walls.append((time.perf_counter() - t0) * 1e3)

    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    _sync(device)
    with profile(activities=activities) as prof:
        for _ in range(args.steps):
            engine.step()
        _sync(device)
    launched = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    kernel_ms = sum(e.time_range.elapsed_us() for e in launched) / 1e3 / args.steps
    step_ms = statistics.median(walls)

    ops = engine.runner.model.kernels
    elementwise = "torch" if ops is None else getattr(ops, "name", None) or type(ops).__name__
    print(f"{args.shape} {args.dtype} on {device}: {len(engine.scheduler.running)} running")
    print(f"elementwise ops: {elementwise}; attention backend {engine.backend.name}")
    print(f"{prefill_steps} steps to finish the prompts; then {args.steps} decode steps timed")
    print(f"decode step: median {step_ms:.2f} ms (min {min(walls):.2f}, max {max(walls):.2f})")
    if device.type == "cuda":
        print(
            f"per step: {len(launched) / args.steps:.0f} kernels, {kernel_ms:.2f} ms of kernel "
            f"time: device busy {kernel_ms / step_ms:.0%} of the step's wall time"
        )
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
    for i in range(len(requests)):
        engine.abort_request(f"r{i}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
