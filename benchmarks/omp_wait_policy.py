"""A/B of OpenMP's wait policy for pdserve's offline engine, alternating in fresh processes.

    python benchmarks/omp_wait_policy.py --num-requests 8 --rounds 2 \
        [--policies PASSIVE ACTIVE SPIN10000] [--busy 2]

Each run is a child process with the policy set before torch loads; policies alternate (PASSIVE,
ACTIVE, PASSIVE, ...) so drifting machine load hits both. A policy is ``PASSIVE`` or ``ACTIVE``
(``OMP_WAIT_POLICY``) or ``SPIN<n>``: no wait policy and ``GOMP_SPINCOUNT=n`` (libgomp's threads
spin n rounds at a region's end, then sleep), optionally followed by ``/POOL<us>``: the compiled
kernels' own pool spins up to that many microseconds (``PDSERVE_CPU_SPIN_US``; 0 never spins;
without it the pool's default, kernels/cpu/pool.h). pdserve's defaults are ``PASSIVE`` for
OpenMP (torch's own ops) and the pool's adaptive spin. ``--busy n``
runs n single-threaded busy loops beside every run: the shared machine whose cores the threads
lose while they spin. Prints output tok/s per run and each policy's median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_CHILD = """
import json, sys, time
from benchmarks.workloads import ensure_model_folder, make_workload
from pdserve import LLM, SamplingParams
folder, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
llm = LLM(folder, dtype="float32", num_kv_blocks=2048, skip_tokenizer_init=True)
reqs = make_workload(n, (32, 512), (16, 256), 800, seed)
prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in reqs]
params = [SamplingParams(temperature=0, max_tokens=r.max_tokens, ignore_eos=True) for r in reqs]
llm.generate(prompts[:2], [SamplingParams(max_tokens=4, ignore_eos=True)] * 2)
t = time.perf_counter()
outs = llm.generate(prompts, params)
dt = time.perf_counter() - t
n_out = sum(len(o.token_ids) for o in outs)
print(json.dumps({"seconds": dt, "output_tokens": n_out,
                  "prompt_tokens": sum(len(p["prompt_token_ids"]) for p in prompts)}))
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--num-requests", type=int, default=8)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--model-dir",
        type=Path,
        default=Path.home() / ".cache" / "pdserve" / "bench" / "smollm2-135m-shape-random-fp32",
    )
    p.add_argument("--policies", nargs="+", default=["PASSIVE", "ACTIVE"])
    p.add_argument("--busy", type=int, default=0, help="busy loops beside each run")
    a = p.parse_args()
    sys.path.insert(0, str(REPO))
    from benchmarks.workloads import ensure_model_folder

    folder = ensure_model_folder(a.model_dir)
    print(f"{'policy':14} {'round':>5} {'prompt':>7} {'output':>7} {'seconds':>8} {'tok/s':>7}")
    results: dict[str, list[float]] = {policy: [] for policy in a.policies}
    for r in range(a.rounds):
        for policy in a.policies:
            busy = [
                subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.busy)
            ]
            try:
                out = subprocess.run(
                    [sys.executable, "-c", _CHILD, str(folder), str(a.num_requests), str(a.seed)],
                    env=policy_env(policy),
                    capture_output=True,
                    text=True,
                    check=True,
                    cwd=REPO,
                )
            finally:
                for b in busy:
                    b.kill()
                    b.wait()
            res = json.loads(out.stdout.strip().splitlines()[-1])
            tps = res["output_tokens"] / res["seconds"]
            results[policy].append(tps)
            print(
                f"{policy:14} {r + 1:>5} {res['prompt_tokens']:>7} {res['output_tokens']:>7} "
                f"{res['seconds']:>8.1f} {tps:>7.1f}",
                flush=True,
            )
    base = statistics.median(results[a.policies[0]])
    for policy, tps_list in results.items():
        med = statistics.median(tps_list)
        print(f"{policy:14} median {med:.1f} tok/s, {med / base:.2f}x {a.policies[0]}")
    return 0


POOL_ENV = "PDSERVE_CPU_SPIN_US"


def policy_env(policy: str) -> dict[str, str]:
    """The child's environment for one policy (see the module docstring)."""
    dropped = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", POOL_ENV)
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env["PYTHONPATH"] = str(REPO)
    omp, _, pool = policy.partition("/")
    if omp.startswith("SPIN"):
        env["GOMP_SPINCOUNT"] = omp.removeprefix("SPIN")
    elif omp in ("PASSIVE", "ACTIVE"):
        env["OMP_WAIT_POLICY"] = omp
    else:
        raise SystemExit(f"unknown policy {policy!r}: PASSIVE, ACTIVE or SPIN<n>[/POOL<us>]")
    if pool:
        if not pool.startswith("POOL") or not pool.removeprefix("POOL").isdigit():
            raise SystemExit(f"unknown pool setting {pool!r} in {policy!r}: POOL<us>")
        env[POOL_ENV] = pool.removeprefix("POOL")
    return env


if __name__ == "__main__":
    sys.exit(main())
