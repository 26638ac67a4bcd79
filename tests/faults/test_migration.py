"""Issue 15: request migration. A decode worker that dies (kill -9), stalls (SIGSTOP) or drains
(SIGTERM), and a prefill worker that dies mid-prefill, cost their clients nothing: every stream
continues on another worker, and what the client receives — every gRPC delta, every SSE chunk
— is exactly the uninterrupted run's, token for token (greedy: HF's), with exact usage counts.
When no worker can take a request over, the client gets UNAVAILABLE naming why.

Real processes on loopback: 2 prefill + 2 decode workers and the router. Each scenario runs a
mix (greedy, seeded, seeded with min_tokens and penalties, a long stop string that holds text
back across the switch, logprobs over SSE) uninterrupted first, then again with the fault.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from tests.faults.cluster import Cluster, start_cluster
from tests.faults.migration_mix import (
    MAX_TOKENS,
    assert_same,
    migrations,
    mix,
    run_mix,
    uninterrupted,
)
from tests.hf_oracle import hf_greedy

AVOID_FAILED_S = 5.0  # router.disaggregated_backend: a worker that lost a request is avoided

STALL_S = 6.0  # decode heartbeats every ~1 s; generous for a loaded 2-core machine


def busier(cluster: Cluster) -> int:
    """The decode worker holding more running streams now. kv_aware sends a prompt back where
    its prefix is cached, so where a run's streams land follows earlier runs' placement: a
    fault aimed at a fixed worker may find it holding none."""
    loads = [w.load() for w in cluster.decode]
    i = max(range(len(loads)), key=lambda j: loads[j].num_running_requests)
    assert loads[i].num_running_requests, loads
    return i


def test_decode_stall_and_drain_and_prefill_death_migrate_every_stream(llama: Path) -> None:
    with start_cluster(
        llama,
        num_prefill=2,
        num_decode=2,
        # Every prompt prefills on a prefill worker, cached on decode or not (the uninterrupted
        # run caches them there; a local prefill would never reach the killed prefill worker).
        router_args=[
            *("--stall-timeout-s", str(STALL_S)),
            *("--local-prefill-max-tokens", "0", "--local-prefill-hit-ratio", "2"),
        ],
        # A short handover window, so the drained worker's streams (1,200 tokens, ~3 s on this
        # tiny model) are still running when it ends: with 1 s, one CI run on a loaded machine
        # saw no drain migration at all (every stream exact, none moved; the cause was not
        # logged, so the assertion below now carries the processes' output).
        decode_args=["--drain-migrate-after-s", "0.3", "--shutdown-grace-s", "30"],
        num_kv_blocks=1024,
    ) as cluster:
        expected, stop = uninterrupted(cluster, llama)
        reqs = mix(stop)

        # SIGSTOP the decode worker that holds more streams, mid-decode: they stall, then
        # continue on the other. (kv_aware sends a prompt back where its prefix is cached, so
        # where the streams land follows earlier runs' placement: a fixed worker may hold none.)
        stalled: list[int] = []

        def pause_the_busier() -> None:
            stalled.append(busier(cluster))
            cluster.decode[stalled[0]].pause()

        try:
            got = asyncio.run(run_mix(cluster, reqs, pause_the_busier))
        finally:
            for i in stalled:
                cluster.decode[i].resume()
        assert_same(got, expected, cluster)
        assert migrations(cluster).get(("decode", "stall"), 0) >= 1, migrations(cluster)
        cluster.wait_pools_free()

        # SIGTERM the busier decode worker mid-decode: after --drain-migrate-after-s its
        # streams move to the other (the stalled one is back in routing once it answers again
        # and the router's avoidance of a worker that lost a request has passed).
        time.sleep(AVOID_FAILED_S + 1)
        deadline = time.monotonic() + 30
        while cluster.router.health()["load"]["num_blocks"] < sum(
            w.load().num_blocks for w in cluster.workers
        ):
            assert time.monotonic() < deadline, "decode 0 did not rejoin routing"
            time.sleep(0.2)
        before = migrations(cluster).get(("decode", "drain"), 0)
        drained: list[int] = []

        def terminate_the_busier() -> None:
            drained.append(busier(cluster))
            cluster.decode[drained[0]].proc.terminate()

        got = asyncio.run(run_mix(cluster, reqs, terminate_the_busier))
        assert_same(got, expected, cluster)
        drains = migrations(cluster).get(("decode", "drain"), 0)
        assert drains > before, (migrations(cluster), cluster.logs()[-6000:])
        assert cluster.decode[drained[0]].proc.wait(30) == 0
        cluster.wait_pools_free()

        # kill -9 a prefill worker while it holds prefills (stopped first, so they wait there).
        def kill_prefill() -> None:
            cluster.prefill[0].kill()

        cluster.prefill[0].pause()
        got = asyncio.run(run_mix(cluster, reqs, kill_prefill, after_tokens=0, stagger_s=0.05))
        assert_same(got, expected, cluster)
        counts = migrations(cluster)
        assert sum(n for (phase, _), n in counts.items() if phase == "prefill") >= 1, counts
        cluster.wait_pools_free()


def test_decode_death_migrates_and_no_worker_left_is_a_clear_error(llama: Path) -> None:
    with start_cluster(
        llama,
        num_prefill=2,
        num_decode=2,
        router_args=["--stall-timeout-s", str(STALL_S)],
        num_kv_blocks=1024,
    ) as cluster:
        expected, stop = uninterrupted(cluster, llama)
        reqs = mix(stop)
        killed: list[int] = []

        def kill_the_busier() -> None:
            killed.append(busier(cluster))
            cluster.decode[killed[0]].kill()

        got = asyncio.run(run_mix(cluster, reqs, kill_the_busier))
        assert_same(got, expected, cluster)
        assert migrations(cluster).get(("decode", "worker_lost"), 0) >= 1, migrations(cluster)
        cluster.wait_pools_free()

        # The last decode worker stalls: nowhere to migrate, a clear error for every stream.
        last = cluster.decode[1 - killed[0]]
        try:
            got = asyncio.run(run_mix(cluster, reqs[:2], last.pause, after_tokens=10))
        finally:
            last.resume()
        for name, s in got.items():
            assert s.error is not None and s.error.startswith("UNAVAILABLE"), (name, s)
            assert "stalled" in s.error and "migrating the request failed" in s.error, s.error
            assert "no decode worker is available" in s.error, s.error
        cluster.wait_pools_free()


def test_a_stopped_or_terminated_prefill_worker_costs_nothing(llama: Path) -> None:
    """Prompts no worker has cached, all prefilled remotely (--local-prefill-max-tokens 0):
    those on a SIGSTOPped prefill worker move to the other once decode's lease on their
    blocks expires unrenewed (the failure is the prefill worker's, so it is the one avoided);
    those queued on a prefill worker that gets SIGTERM with no grace move too (or finish
    first). Both runs equal the uninterrupted one, run afterwards (greedy: HF's)."""
    with start_cluster(
        llama,
        num_prefill=2,
        num_decode=2,
        router_args=["--stall-timeout-s", str(STALL_S), "--local-prefill-max-tokens", "0"],
        prefill_args=["--shutdown-grace-s", "0"],
        decode_args=["--kv-lease-s", "3"],
        num_kv_blocks=1024,
    ) as cluster:
        stopped, reqs = cluster.prefill[0], mix(base=10)
        stopped.pause()
        try:
            got_stop = asyncio.run(run_mix(cluster, reqs))
        finally:
            stopped.resume()
        counts = migrations(cluster)
        assert counts.get(("prefill", "stall"), 0) >= 1, counts
        cluster.wait_pools_free()

        def terminate_while_queued() -> None:
            time.sleep(1.5)  # the Prefill calls have reached the stopped worker's socket
            stopped.proc.terminate()
            stopped.resume()

        time.sleep(AVOID_FAILED_S + 1)  # prefill 0 is routed to again
        stopped.pause()
        got_term = asyncio.run(run_mix(cluster, reqs, terminate_while_queued, after_tokens=0))
        assert stopped.proc.wait(30) == 0
        # Its queued prefills are refused with "shutting down" and migrate, or (a tiny
        # model's prefill takes milliseconds) finish before the drain looks: either way the
        # streams must equal the uninterrupted run, checked below.
        print("migrations after the SIGTERM run:", migrations(cluster))
        cluster.wait_pools_free()

        expected = asyncio.run(run_mix(cluster, reqs))
        for name, s in expected.items():
            assert s.error is None and s.finish_reason == "length", (name, s)
        assert expected["greedy-a"].token_ids == hf_greedy(llama, reqs[0].prompt, MAX_TOKENS)
        assert_same(got_stop, expected, cluster)
        assert_same(got_term, expected, cluster)
        cluster.wait_pools_free()
