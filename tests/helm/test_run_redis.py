"""Run the chart's Redis (gpu-production: password from a Secret, a claim per pod) with the
real redis-server, from its own StatefulSet spec, waited on with its declared probes; then
reach it the way the workers are told to: the --redis-url they get, the password file
mounted from the same Secret. (The workers themselves cannot register yet: --redis-url is
pending, issue 14.)"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helm.chart import containers, example_values, objects, render
from tests.helm.local_release import LocalRelease, free_ports
from tests.helm.probes import run_probe, wait_probe

pytestmark = [
    pytest.mark.timeout(120),
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
