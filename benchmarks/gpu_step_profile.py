"""Where a pdserve decode step's time goes on a GPU: host work against device work.

    python benchmarks/gpu_step_profile.py [--shape smollm2-135m] [--dtype float32] \\
        [--num-requests 32] [--steps 20]

Runs the offline benchmark's workload (same seed, same random model folder) through an
``LLMEngine`` on the default device until every request has finished its prompt, then times
``--steps`` pure decode steps (device synchronised around each) and runs ``torch.profiler`` over
as many more. Prints per step: wall milliseconds, the kernels launched and the summed time they
ran on the device, so ``busy`` = kernel time / wall says how much of the step the GPU works and
how much it waits for Python to launch the next kernel; and the top ops by self CPU time. On
CUDA it does this twice in one invocation, with the layers' elementwise ops as torch ops
(``PDSERVE_GPU_POINTWISE=0``) and as the Triton kernels of ``kernels/pointwise.py``, and prints
the ratio. On a CPU it runs the default path once (no kernels to count), which is how it is
tested.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.workloads import SHAPES, default_model_dir, ensure_model_folder, make_workload
from engine.engine_config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.model_runner import GPU_POINTWISE_ENV
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


@dataclass
class Profiled:
    label: str
    elementwise: str
    prefill_steps: int
    walls_ms: list[float]
    kernels_per_step: float
    kernel_ms: float
    table: str

    @property
    def step_ms(self) -> float:
        return statistics.median(self.walls_ms)


def profile_decode(folder: Path, args: argparse.Namespace, label: str) -> Profiled:
    """One engine (made now, so it reads the environment now): the workload's prompts, then
    ``args.steps`` decode steps timed and as many profiled."""
    vocab_size = int(json.loads((folder / "config.json").read_text())["vocab_size"])
    # Outputs long enough that every request is still decoding through both measured windows.
    out_len = 3 * args.steps + 64
    requests = make_workload(args.num_requests, (32, 512), (out_len, out_len), vocab_size, 0)
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
    ops = engine.runner.model.kernels
    for i in range(len(requests)):
        engine.abort_request(f"r{i}")
    return Profiled(
        label=label,
        elementwise="torch" if ops is None else getattr(ops, "name", None) or type(ops).__name__,
        prefill_steps=prefill_steps,
        walls_ms=walls,
        kernels_per_step=len(launched) / args.steps,
        kernel_ms=sum(e.time_range.elapsed_us() for e in launched) / 1e3 / args.steps,
        table=prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15),
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-135m")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--steps", type=int, default=20, help="timed steps, then as many profiled")
    p.add_argument(
        "--model-dir",
        type=Path,
        default=None,
        help="a model folder to run as it is (default: the benchmark's random model of --shape, "
        "made once)",
    )
    args = p.parse_args(argv)

    if args.model_dir is not None:
        folder = args.model_dir
        name = folder.name
    else:
        folder = ensure_model_folder(default_model_dir(args.shape), shape=args.shape)
        name = args.shape
    runs = []
    if torch.cuda.is_available():  # the GPU's elementwise ops both ways, torch's first
        for label, value in (("torch elementwise ops", "0"), ("Triton elementwise ops", "1")):
            os.environ[GPU_POINTWISE_ENV] = value
            runs.append(profile_decode(folder, args, label))
            torch.cuda.empty_cache()
    else:
        runs.append(profile_decode(folder, args, "default path"))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"{name} {args.dtype} on {device}: {args.num_requests} requests decoding")
    for r in runs:
        print(f"\n## {r.label} (elementwise: {r.elementwise})\n{r.table}")
    print(f"\n{'run':<24} {'step ms (median; min-max)':>28} {'kernels':>8} {'kernel ms':>10} busy")
    for r in runs:
        timing = f"{r.step_ms:.2f}; {min(r.walls_ms):.2f}-{max(r.walls_ms):.2f}"
        busy = f"{r.kernel_ms / r.step_ms:.0%}" if device == "cuda" else "-"
        line = f"{r.label:<24} {timing:>28} {r.kernels_per_step:>8.0f} {r.kernel_ms:>10.2f}"
        print(f"{line} {busy}")
    if len(runs) == 2:
        print(f"decode step, torch ops / Triton ops: {runs[0].step_ms / runs[1].step_ms:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
