"""Run the chart's Redis (gpu-production: password from a Secret, a claim per pod) with the
real redis-server, from its own StatefulSet spec, waited on with its declared probes; then
reach it the way the workers are told to: the --redis-url they get, the password file
mounted from the same Secret. And a whole release in Redis mode (cpu-tiny with
``controlPlane.mode: redis``): the chart's Redis, then the router and workers, which register
under their pod names and are routed to through the registry."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import pytest

from control_plane.redis_store import RedisStore
from tests.helm.chart import containers, example_values, objects, render
from tests.helm.local_pod import LOOPBACK
from tests.helm.local_release import LocalRelease, port_values
from tests.helm.probes import run_probe, wait_probe
from tests.helm.test_run_chart import N, _grpc_generate, _tokenize
from tests.hf_oracle import hf_greedy
from tests.sockets import free_ports

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        shutil.which("redis-server") is None or shutil.which("redis-cli") is None,
        reason="redis-server not installed (tests/ci/install.sh installs it)",
    ),
]
PASSWORD = "s3cret-from-the-secret"


def _cli(url: str, *args: str, password_file: Path | None = None) -> str:
    cmd = ["redis-cli", "-u", url]
    if password_file is not None:
        cmd += ["-a", password_file.read_text(), "--no-auth-warning"]
    r = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=10)
    return (r.stdout + r.stderr).strip()


def test_redis_runs_from_its_spec_and_workers_reach_it(tmp_path: Path) -> None:
    values = example_values("gpu-production")
    (port,) = free_ports(1)
    values["redis"]["port"] = port
    objs = objects(render(values))
    rel = LocalRelease(objs, tmp_path)
    rel.cluster.secrets["pdserve-redis"] = {"password": PASSWORD}
    try:
        rel.start(["redis"])
        pod = rel.pods["redis"]
        readiness = wait_probe(pod, "readinessProbe")
        assert readiness[-1].detail == "exit 0: PONG"  # redis-cli ping, authenticated
        assert run_probe(pod, "livenessProbe").ok

        # What the decode workers are given (their pending flags, rendered today).
        (decode,) = [c for c in containers(objs) if c.role == "decode"]
        args = decode.spec["args"]
        url = rel.cluster.map_addresses(args[args.index("--redis-url") + 1])
        assert url == f"redis://127.0.0.1:{port}/0"
        password_file = args[args.index("--redis-password-file") + 1]
        mounts = {m["mountPath"]: m["name"] for m in decode.spec["volumeMounts"]}
        volumes = {v["name"]: v for v in decode.pod["volumes"]}
        secret_dir = str(Path(password_file).parent)
        assert volumes[mounts[secret_dir]]["secret"]["secretName"] == "pdserve-redis"
        (tmp_path / "password").write_text(PASSWORD)  # the Secret's key, as mounted

        assert "NOAUTH" in _cli(url, "ping")  # no password, no service
        assert _cli(url, "ping", password_file=tmp_path / "password") == "PONG"
        assert _cli(url, "set", "k", "v", password_file=tmp_path / "password") == "OK"
    finally:
        rel.stop()
    assert pod.process is not None and pod.process.returncode == 0


def _registered(url: str) -> dict[str, str]:
    async def members() -> dict[str, str]:
        store = RedisStore(url, "default")
        try:
            _, infos = await store.list_members()
        finally:
            await store.close()
        return {i.worker_id: i.role for i in infos}

    return asyncio.run(members())


def test_a_redis_mode_release_registers_and_serves(tmp_path: Path) -> None:
    values = example_values("cpu-tiny")
    for role, ports in port_values().items():
        values.setdefault(role, {}).update(ports)
    (port,) = free_ports(1)
    values["controlPlane"] = {"mode": "redis"}
    values.setdefault("redis", {})["port"] = port
    rel = LocalRelease(objects(render(values)), tmp_path)
    try:
        rel.start(["redis", "router", "prefill", "decode"])  # all at once, as a rollout
        rel.wait_ready()
        url = f"redis://{LOOPBACK}:{port}/0"
        registered = _registered(url)
        names = {rel.pods[r].name: r for r in ("prefill", "decode")}
        assert registered == names, registered  # --worker-id $(POD_NAME), each its role

        # Routed through the registry: greedy tokens equal HF's on the pods' own model.
        grpc_address = f"{LOOPBACK}:{rel.pods['router'].ports['grpc']}"
        ids = _tokenize(grpc_address, "The capital of France is")
        folder = rel.pods["decode"].mounts["/var/cache/pdserve"] / "demo-llama-v1"
        tokens = [t for m in _grpc_generate(grpc_address, ids) for t in m.token_ids]
        assert tokens == hf_greedy(folder, ids, N)

        rel.pods["decode"].terminate()  # drain: it leaves the registry first
        assert rel.pods["decode"].process is not None
        rel.pods["decode"].process.wait(60)
        assert _registered(url) == {rel.pods["prefill"].name: "prefill"}
    except AssertionError as e:
        raise AssertionError(f"{e}\n{rel.logs()}") from None
    finally:
        rel.stop()
