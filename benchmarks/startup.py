"""How long `pdserve serve` takes from its command to its first 200 on ``/health`` (the server can
serve), colocated and disaggregated (a router and one prefill and one decode worker, each
process loading what it needs), on the built-in demo model; optionally beside other working
trees, the trees taking turns (benchmarks/ab_checkouts.py).

    python benchmarks/startup.py [--against /path/to/other/worktree ...] [--rounds 5]

``--against`` is another working tree, e.g. ``git worktree add /tmp/base <commit>``. Each
round starts each mode once per tree, one server at a time; the report is the median of the
rounds per tree and mode, and each other tree's ratio to this one. A worker's start is what a
request waits for after a crash or a scale-up, before the server can take it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.ab_checkouts import alternate

MODES = ("colocated", "disaggregated")

# Run in the tree given as argv[1]: start each mode, time it to /health 200, stop it (SIGTERM,
# then SIGKILL after 60 s).
CHILD = """
import json, os, subprocess, sys, time
tree = sys.argv[1]
sys.path.insert(0, tree)
from benchmarks.http_ready import wait_http_ok
from pdserve.launch import stop_workers
result = {}
for mode in %(modes)r:
    flags = ["--colocated"] if mode == "colocated" else []
    env = {**os.environ, "PYTHONPATH": tree}
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pdserve", "serve", *flags, "--grpc-port", "0", "--http-port",
         "0"], cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        url = None
        for line in proc.stdout:
            if line.startswith("pdserve: HTTP "):
                url = line.split()[-1]
                break
        if url is None:
            raise RuntimeError(f"{mode}: the server exited before it listened")
        wait_http_ok(url + "/health", 300, interval_s=0.05)
        result[mode + "_s"] = time.perf_counter() - t0
    finally:
        stop_workers([proc], timeout_s=60)
print("RESULT " + json.dumps(result))
"""


def main(argv: list[str] | None = None) -> dict[Path, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--against", type=Path, action="append", default=[])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    args = parser.parse_args(argv)
    here = Path(__file__).resolve().parent.parent
    trees = [here, *(t.resolve() for t in args.against)]
    medians = alternate(trees, CHILD % {"modes": tuple(args.modes)}, args.rounds)
    print(f"`pdserve serve` to /health 200, seconds, median of {args.rounds} alternating rounds")
    for mode in args.modes:
        key = mode + "_s"
        for t in trees:
            ratio = "" if t == here else f"  ({medians[t][key] / medians[here][key]:.2f}x this)"
            print(f"  {mode:14} {medians[t][key]:6.2f} s  {t}{ratio}")
    return medians


if __name__ == "__main__":
    main()
