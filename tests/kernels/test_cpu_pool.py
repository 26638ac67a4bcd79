"""The compiled kernels' thread pool (kernels/cpu/pool.h): the same results however its threads
wait, from several Python threads at once, after a fork, and under contention, where it must
stop spinning. Each case that sets the pool's environment runs in a fresh process (the pool
reads it once)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
import torch
import torch.nn.functional as F

from tests.child_python import run_python
from tests.kernels.cpu_ops import cpu_ops

# Packed linears of several shapes against float64; prints the worst error and the pool state.
_CHECK = """
import sys, torch, torch.nn.functional as F
import kernels.cpu as cpu
ops = cpu.load()
assert ops is not None, "kernels did not load"
torch.manual_seed(0)
worst = 0.0
for m, k, n in [(1, 576, 960), (18, 576, 3072), (33, 100, 37), (400, 96, 50)]:
    x, w = torch.randn(m, k), torch.randn(n, k)
    got = ops.linear(x, ops.pack_linear_weight(w), n, None)
    worst = max(worst, (got.double() - F.linear(x.double(), w.double())).abs().max().item())
print(worst, *ops.pool_state())
"""


@pytest.mark.parametrize("spin_us", ["0", "200", "5000"])
def test_results_do_not_depend_on_the_spin(spin_us):
    cpu_ops()
    out = run_python(_CHECK, PDSERVE_CPU_SPIN_US=spin_us)
    assert out.returncode == 0, out.stderr
    worst, spin, _backing_off = out.stdout.split()
    assert float(worst) < 1e-3
    assert float(spin) == float(spin_us)


@pytest.mark.parametrize("bad", ["-1", "fast", "1e"])
def test_bad_spin_setting_is_refused_by_name(bad):
    cpu_ops()
    out = run_python("import kernels.cpu as cpu; cpu.load()", PDSERVE_CPU_SPIN_US=bad)
    assert out.returncode != 0
    assert "PDSERVE_CPU_SPIN_US" in out.stderr and repr(bad) in out.stderr


def test_concurrent_callers_from_python_threads():
    """Torch runs custom ops without the GIL: jobs from several threads queue for the pool,
    each returning its own, correct, result."""
    ops = cpu_ops()
    torch.manual_seed(1)
    w = torch.randn(3072, 576)
    packed = ops.pack_linear_weight(w)
    inputs = [torch.randn(18, 576) for _ in range(6)]
    # Each output panel is one thread's, in one order: results are bitwise those of a lone call.
    expected = [ops.linear(x, packed, 3072, None) for x in inputs]
    torch.testing.assert_close(expected[0], F.linear(inputs[0], w), atol=1e-4, rtol=1e-4)
    errors: list[BaseException] = []

    def call(i: int) -> None:
        try:
            for _ in range(20):
                assert torch.equal(ops.linear(inputs[i], packed, 3072, None), expected[i])
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a caller hung"
    assert not errors, errors[0]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_gets_a_pool_of_its_own():
    """A child forked after the pool started has none of its workers: it must start its own
    (a job handed to the parent's workers would never finish)."""
    code = """
    import os, sys, torch, torch.nn.functional as F
    import kernels.cpu as cpu
    ops = cpu.load()
    torch.set_num_threads(2)
    w = torch.randn(960, 576); packed = ops.pack_linear_weight(w); x = torch.randn(18, 576)
    ops.linear(x, packed, 960, None)  # the parent's pool is running
    pid = os.fork()
    if pid == 0:
        ok = torch.allclose(ops.linear(x, packed, 960, None), F.linear(x, w), atol=1e-4)
        os._exit(0 if ok else 3)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status))
    """
    cpu_ops()
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "0"


def test_contention_turns_spinning_off():
    """With more busy processes than cores beside it, a spinning wait loses its core to them:
    the pool notices and backs off (every wait sleeps), results unchanged."""
    cpu_ops()
    n_busy = 2 * (os.cpu_count() or 2)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n_busy)]
    try:
        code = """
        import time, torch
        import kernels.cpu as cpu
        ops = cpu.load()
        torch.set_num_threads(2)
        w = torch.randn(576, 576); packed = ops.pack_linear_weight(w); x = torch.randn(18, 576)
        seen = False
        stop = time.monotonic() + 20
        while time.monotonic() < stop and not seen:
            for _ in range(50):
                ops.linear(x, packed, 576, None)
            seen = ops.pool_state()[1]
        print(seen)
        """
        out = run_python(code, PDSERVE_CPU_SPIN_US="2000")
    finally:
        for b in busy:
            b.kill()
            b.wait()
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "True"


MS = 1_000_000  # ns


@pytest.mark.parametrize(
    ("running", "own_ms", "window_ms", "pool_threads", "crowded"),
    [
        (2, 5.0, 10.0, 2, False),  # no task waits: never crowded
        (1, 0.0, 10.0, 2, False),
        (3, 19.0, 10.0, 2, False),  # the process had both CPUs: its own threads were waiting
        (4, 15.5, 10.0, 2, False),  # (colocated serving: the router's loop, gRPC threads)
        (3, 13.3, 10.0, 2, True),  # 2/3 of them: a busy process beside, sharing the cores
        (6, 5.0, 10.0, 2, True),
        (3, 9.0, 10.0, 1, False),  # a pool of one thread: its share is one CPU
        (3, 6.0, 10.0, 1, True),
        (3, -1.0, 10.0, 2, True),  # no CPU clock: the count alone decides
        (3, 19.0, 0.0, 2, True),  # no window, or one past an idle gap, tells nothing
        (3, 190.0, 150.0, 2, True),
    ],
)
def test_a_sample_is_crowded_only_when_other_processes_take_the_cores(
    running, own_ms, window_ms, pool_threads, crowded
):
    """Two CPUs. Tasks waiting beyond them are taken for other processes' only where this
    process got less than 3/4 of the CPUs its pool uses since the sample before."""
    ops = cpu_ops()
    own = -1 if own_ms < 0 else int(own_ms * MS)
    got = ops.pool_crowded_sample(running, 2, own, int(window_ms * MS), pool_threads)
    assert got is crowded
