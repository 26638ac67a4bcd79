"""How long ``pdserve router`` takes to start serving, and how much memory it holds, over real
workers (one prefill, one decode, started once). The router runs no model: its start time and
RSS are what a router replica costs.

    python benchmarks/router_footprint.py [--runs 5] [--model DIR]

Prints per-run figures and the medians: seconds from spawn to the "pdserve: HTTP" line, and
VmRSS / VmHWM (peak) in MiB read from /proc once it serves.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pdserve.launch import start_worker, stop_workers, wait_healthy  # noqa: E402
from pdserve.ports import free_port  # noqa: E402


def _mem_mib(pid: int) -> tuple[float, float]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--model", default=None, help="model folder (default: the demo model)")
    a = ap.parse_args()
    from engine.demo_model import demo_model_path

    model = a.model or str(demo_model_path())
    ports = {"decode": free_port(), "prefill": free_port()}
    extra = {"decode": ["--kv-transport", "tcp"], "prefill": []}
    procs = [
        start_worker(role, model, port, [*extra[role], "--metrics-port", "-1"], None)
        for role, port in ports.items()
    ]
    try:
        for port, proc in zip(ports.values(), procs, strict=True):
            wait_healthy(f"127.0.0.1:{port}", proc, 300)
        starts, rss, peak = [], [], []
        for run in range(a.runs):
            cmd = [
                sys.executable, "-m", "pdserve", "router", "--model", model,
                "--decode", f"127.0.0.1:{ports['decode']}",
                "--prefill", f"127.0.0.1:{ports['prefill']}",
                "--grpc-port", "0", "--http-port", "0",
            ]  # fmt: skip
            env = dict(os.environ, PYTHONPATH=str(ROOT))
            t0 = time.monotonic()
            p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
            assert p.stdout is not None
            for line in p.stdout:
                if line.startswith("pdserve: HTTP"):
                    break
            else:
                raise RuntimeError(f"router exited with {p.wait()}")
            elapsed = time.monotonic() - t0
            time.sleep(0.5)  # let the first load polls settle
            now, hwm = _mem_mib(p.pid)
            p.terminate()
            p.wait(30)
            starts.append(elapsed)
            rss.append(now)
            peak.append(hwm)
            print(f"run {run}: start {elapsed:.2f} s, RSS {now:.0f} MiB, peak {hwm:.0f} MiB")
        print(
            f"median: start {statistics.median(starts):.2f} s, "
            f"RSS {statistics.median(rss):.0f} MiB, peak {statistics.median(peak):.0f} MiB "
            f"({a.runs} runs; load {os.getloadavg()[0]:.1f})"
        )
    finally:
        stop_workers(procs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
