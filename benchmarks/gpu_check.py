"""One prepared check of the GPU path for a lent CUDA machine (an H200): about 6 minutes.

    python benchmarks/gpu_check.py [--out DIR] [--wheels DIR] [--budget-s 420]
    python benchmarks/gpu_check.py --dry-run     # on CPU: plans every step, runs what can run
    python benchmarks/gpu_check.py --download-wheels .whl   # here, before the device call

On a lent machine (its tree is this repository's; ``.whl`` ignored by git and carried):
``python3 benchmarks/gpu_check.py --wheels .whl --out $OUT``.

Steps, in order, each under its own time limit and the whole under ``--budget-s`` (a step
that would start past it is skipped and reported so):

1. ``env``: versions of python/torch/triton/transformers, the CUDA device; pdserve's missing
   Python dependencies installed from ``--wheels`` (``pip --no-index``: the machine reaches no
   index; its image brings its own torch, triton and transformers, which are never replaced);
   the compiled CPU kernels built once (``python -m kernels.cpu``).
2. ``kernel-tests``: ``tests/kernels`` compiled on the GPU (``TRITON_INTERPRET=0``), the
   compiled CPU kernels' tests included (on that machine's ISA: AVX-512 where it has it).
3. ``hf-exact-triton``: ``tests/engine/test_hf_exactness.py`` on CUDA, where the engine picks
   the Triton backend: greedy tokens equal Hugging Face's through every scheduler path.
4. ``offline-135m``: ``benchmarks/offline_throughput.py --engines pdserve,hf-static`` on the
   SmolLM2-135M-shaped random model, fp32: pdserve beside HF ``generate`` on the same card, and
   the workload's floor from the card's measured GEMM rate and HBM bandwidth.
5. ``step-profile``: ``benchmarks/gpu_step_profile.py``: a decode step of 32 requests on the
   135M shape, its wall time against the kernels it launches and their device time, with the
   layers' elementwise ops as torch ops and as Triton kernels (``kernels/pointwise.py``).
6. ``kernel-bench``: ``benchmarks/kernels.py`` (GB/s of each Triton kernel vs HBM peak), 70 s
   of configs (45 with ``--quick``).
7. ``offline-1b``: as step 4 on a Llama-3.2-1B-shaped random model, bf16.

Measured on an H200 (2026-12-04, docs/benchmarks.md "The GPU path on an H200"): the steps took
19, 85-97, 37, 84, about 40, 33 and 91 s. Its image lacked only ``llguidance`` (carry its wheel:
``--wheels``). Eight files come back from a lent machine: the seven logs and summary.json.

Every step's output goes to ``DIR/<step>.log`` (``DIR``: ``--out``, else ``$OUT``, else a
temporary folder) and a ``summary.json`` lists each step's command, exit status and seconds.
``--dry-run`` (no GPU needed) prints the plan and, per step, runs a CPU stand-in that checks
the step can start: versions, test collection, ``kernels.py --smoke-on-cpu``, and the
benchmarks' argument parsing with the exact flags the step would pass.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# Imports the steps need, by module name -> the distribution to install if it is missing.
REQUIRED = {
    "torch": "torch",
    "triton": "triton",
    "transformers": "transformers",
    "safetensors": "safetensors",
    "tokenizers": "tokenizers",
    "numpy": "numpy",
    "pytest": "pytest",
    "xdist": "pytest-xdist",
    "pytest_timeout": "pytest-timeout",
    "setuptools": "setuptools",
    "ninja": "ninja",
    "llguidance": "llguidance",  # the engine's structured outputs, imported by its sampler
}
IMAGE_OWNED = ("torch", "triton", "transformers")  # never installed over the image's own
# What the H200 image lacked on 2026-12-04 (the env step lists any other gap): carried as wheels
# for its Python 3.12, downloaded here with --download-wheels at the versions CI pins.
CARRIED = ("llguidance",)
CONSTRAINTS = REPO / "tests" / "ci" / "constraints.txt"


def download_command(wheels: Path, python_version: str = "3.12") -> list[str]:
    """``pip download`` of ``CARRIED`` at the pinned versions, as manylinux x86-64 wheels for
    the GPU machine's Python (it reaches no package index)."""
    pins = dict(
        line.strip().split("==", 1)
        for line in CONSTRAINTS.read_text().splitlines()
        if "==" in line and not line.lstrip().startswith("#")
    )
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    command += ["--python-version", python_version, "--implementation", "cp", "-d", str(wheels)]
    for glibc in (17, 24, 27, 28, 31, 34, 35, 39):
        command += ["--platform", f"manylinux_2_{glibc}_x86_64"]
    return [*command, "--platform", "manylinux2014_x86_64", *(f"{n}=={pins[n]}" for n in CARRIED)]


@dataclass
class Step:
    name: str
    command: list[str]
    limit_s: int
    env: dict[str, str] = field(default_factory=dict)
    dry_command: list[str] | None = None  # the CPU stand-in; None = the command itself


def offline(python: str, shape: str, dtype: str) -> list[str]:
    """offline_throughput.py on the GPU: pdserve beside HF ``generate`` (static batches of all
    32 requests) on the same card in the same dtype, and the floor from the card's own GEMM rate
    and HBM bandwidth (gpu_roofline.py)."""
    command = [python, "benchmarks/offline_throughput.py", "--engines", "pdserve,hf-static"]
    # Three passes: the first compiles Triton kernels for shapes the warm-up did not reach.
    command += ["--gpu-roofline", "--repeats", "3", "--shape", shape, "--pdserve-dtype", dtype]
    return [*command, "--hf-device", "cuda", "--hf-dtype", dtype, "--hf-batch-size", "32"]


def plan(python: str, quick: bool, wheels: Path | None) -> list[Step]:
    offline_135m = offline(python, "smollm2-135m", "float32")
    offline_1b = offline(python, "llama-1b", "bfloat16")
    # The whole picture from one lease: no -x; a per-test limit instead, so a hang costs 90 s.
    pytest = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--tb=short", "-rfE"]
    pytest += ["--maxfail=25", "--timeout=90"]
    profile = [python, "benchmarks/gpu_step_profile.py"]
    env = [python, "benchmarks/gpu_check.py", "--env-only"]
    if wheels is not None:
        env += ["--wheels", str(wheels)]
    # Most important first; the kernel benchmark last, given what is left of the budget.
    return [
        Step("env", env, 60),
        Step(
            "kernel-tests",
            [*pytest, "-n", "8", "tests/kernels"],
            150,
            {"TRITON_INTERPRET": "0"},
            dry_command=[*pytest, "--collect-only", "tests/kernels"],
        ),
        Step(
            "hf-exact-triton",
            [*pytest, "-n", "14", "tests/engine/test_hf_exactness.py"],
            90,
            # One CPU thread a worker: HF's oracle runs on the CPU, and 6 workers of 16 threads
            # each on 16 cores took over 90 s for 12 of the 29 tests (14 workers of one thread
            # each: 37 s for all 29).
            {"TRITON_INTERPRET": "0", "OMP_NUM_THREADS": "1"},
            dry_command=[*pytest, "--collect-only", "tests/engine/test_hf_exactness.py"],
        ),
        Step("offline-135m", offline_135m, 100, dry_command=[*offline_135m, "--plan-only"]),
        Step("step-profile", profile, 75, dry_command=[*profile, "--help"]),
        Step(
            "kernel-bench",
            [python, "benchmarks/kernels.py", "--budget-s", "45" if quick else "70"],
            100,
            dry_command=[python, "benchmarks/kernels.py", "--smoke-on-cpu"],
        ),
        Step("offline-1b", offline_1b, 150, dry_command=[*offline_1b, "--plan-only"]),
    ]


def environment(wheels: Path | None) -> int:
    """Print versions and the device; install missing dependencies from ``wheels``."""
    missing = []
    for module, dist in REQUIRED.items():
        try:
            mod = importlib.import_module(module)
            print(f"{module:<16} {getattr(mod, '__version__', '?')}")
        except ImportError:
            print(f"{module:<16} MISSING")
            missing.append(dist)
    installable = [d for d in missing if d not in IMAGE_OWNED]
    if installable and wheels is not None:
        cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(wheels)]
        print("$", " ".join(cmd + installable), flush=True)
        subprocess.run([*cmd, *installable], check=False)
    elif installable:
        print(f"missing and no --wheels given: {' '.join(installable)}")
    if [d for d in missing if d in IMAGE_OWNED]:
        print("the image lacks torch/triton/transformers: the GPU steps cannot run")
        return 1
    import torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        memory, sms = props.total_memory / 2**30, props.multi_processor_count
        print(f"cuda: {props.name}, {memory:.0f} GiB, {sms} SMs")
    else:
        print("cuda: no device")
    capability = torch.backends.cpu.get_cpu_capability()
    print(f"cpu capability: {capability}, threads {torch.get_num_threads()}")
    # The compiled CPU kernels, built once here so the test workers load them, not race.
    built = subprocess.run([sys.executable, "-m", "kernels.cpu"], check=False)
    print(f"compiled CPU kernels: {'ready' if built.returncode == 0 else 'unavailable'}")
    return 0


def run_step(step: Step, command: list[str], out_dir: Path, limit_s: float) -> dict[str, object]:
    log = out_dir / f"{step.name}.log"
    env = {**os.environ, "PYTHONPATH": str(REPO), **step.env}
    t0 = time.perf_counter()
    with log.open("w") as f:
        f.write("$ " + " ".join(command) + "\n")
        f.flush()
        try:
            rc = subprocess.run(
                command, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=limit_s
            ).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    seconds = time.perf_counter() - t0
    tail = log.read_text(errors="replace").splitlines()[-15:]
    return {"rc": rc, "seconds": round(seconds, 1), "log": str(log), "tail": tail}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=None, help="default: $OUT, else a temp folder")
    p.add_argument("--wheels", type=Path, default=None, help="wheels for missing dependencies")
    p.add_argument("--budget-s", type=float, default=420.0, help="stop starting steps after this")
    p.add_argument("--dry-run", action="store_true", help="plan and CPU stand-ins, no GPU")
    p.add_argument("--quick", action="store_true", help="shorter kernel benchmark")
    p.add_argument("--steps", default=None, help="comma-separated subset of the steps")
    p.add_argument("--env-only", action="store_true", help=argparse.SUPPRESS)
    p.add_argument(
        "--download-wheels",
        type=Path,
        metavar="DIR",
        help="on this machine, before a device call: download the wheels the GPU machine's "
        "image lacks into DIR (carry it, pass it as --wheels there), then exit",
    )
    args = p.parse_args(argv)
    if args.env_only:
        return environment(args.wheels)
    if args.download_wheels:
        return subprocess.run(download_command(args.download_wheels), check=False).returncode

    out_dir = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    if out_dir is None:
        out_dir = Path(tempfile.mkdtemp(prefix="pdserve-gpu-check-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    steps = plan(sys.executable, args.quick, args.wheels)
    if args.steps:
        wanted = set(args.steps.split(","))
        unknown = wanted - {s.name for s in steps}
        if unknown:
            p.error(f"unknown steps {sorted(unknown)}")
        steps = [s for s in steps if s.name in wanted]
    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            print("no CUDA device here: run with --dry-run on CPU", file=sys.stderr)
            return 2

    total = sum(s.limit_s for s in steps)
    mode = "dry run (CPU stand-ins)" if args.dry_run else "GPU run"
    print(f"{mode}: {len(steps)} steps, limits sum to {total} s, budget {args.budget_s:.0f} s")
    start = time.perf_counter()
    summary: list[dict[str, object]] = []
    failed = False
    for step in steps:
        command = step.command
        if args.dry_run and step.dry_command is not None:
            command = step.dry_command
        elapsed = time.perf_counter() - start
        record: dict[str, object] = {**asdict(step), "ran": " ".join(command)}
        # A real step needs a useful share of its limit left; a dry run has no budget.
        if not args.dry_run and elapsed + min(step.limit_s, 30) > args.budget_s:
            record.update(rc=None, skipped=f"budget: {elapsed:.0f} s spent")
            print(f"[{step.name}] skipped (budget)")
        else:
            limit = 300.0 if args.dry_run else min(step.limit_s, args.budget_s - elapsed)
            print(f"[{step.name}] $ {' '.join(command)}  (limit {limit:.0f} s)", flush=True)
            record.update(run_step(step, command, out_dir, limit))
            print(f"[{step.name}] rc {record['rc']} in {record['seconds']} s", flush=True)
            failed |= record["rc"] != 0
        summary.append(record)
    wall = time.perf_counter() - start
    (out_dir / "summary.json").write_text(
        json.dumps({"mode": mode, "wall_s": round(wall, 1), "steps": summary}, indent=1)
    )
    print(f"{mode} done in {wall:.0f} s; logs and summary.json in {out_dir}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
