"""Run the rendered chart: the cpu-tiny example's Deployments started as local processes from
their own command, args, env and volumes (tests/helm/local_pod.py says what stands in for
the cluster), waited on with exactly the probes they declare, then used through the router
over OpenAI HTTP and gRPC: greedy tokens equal Hugging Face's. This proves what rendering
alone cannot: the ports, names, flags, env and probes fit together."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from protos.pdserve.v1 import generate_pb2 as pb
from protos.pdserve.v1 import generate_pb2_grpc as pb_grpc
from tests.helm.chart import REPO_ROOT, by_kind, example_values, objects, render
from tests.helm.local_pod import LOOPBACK
from tests.helm.local_release import LocalRelease, port_values
from tests.helm.probes import run_probe
from tests.helm.test_wiring import all_scaling_metric_names
from tests.hf_oracle import hf_greedy

pytestmark = pytest.mark.timeout(300)
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")
N = 8  # tokens per request
HEALTHCHECK = REPO_ROOT / "docker" / "healthcheck.py"


def cpu_tiny(monitoring: bool = False) -> list[dict[str, Any]]:
    """The cpu-tiny example with free local ports (and, to find the metrics endpoints the
    way Prometheus would, its ServiceMonitors)."""
    values = example_values("cpu-tiny")
    for role, ports in port_values().items():
        values.setdefault(role, {}).update(ports)
    if monitoring:
        values["monitoring"] = {"serviceMonitor": {"enabled": True}}
    return objects(render(values))


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRelease]:
    rel = LocalRelease(cpu_tiny(monitoring=True), tmp_path_factory.mktemp("cpu-tiny"))
    try:
        rel.start(["router", "prefill", "decode"])
        rel.wait_ready()
        yield rel
    except AssertionError as e:
        raise AssertionError(f"{e}\n{rel.logs()}") from None
    finally:
        rel.stop()


def _demo_folder(release: LocalRelease, role: str) -> Path:
    return release.pods[role].mounts["/var/cache/pdserve"] / "demo-llama-v1"


def _router(release: LocalRelease) -> tuple[str, str]:
    ports = release.pods["router"].ports
    return f"http://{LOOPBACK}:{ports['http']}", f"{LOOPBACK}:{ports['grpc']}"


def _grpc_generate(address: str, prompt_ids: list[int]) -> list[pb.GenerateResponse]:
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.GenerationServiceStub(channel)
        req = pb.GenerateRequest(
            sampling_params=pb.SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True)
        )
        req.token_ids.ids.extend(prompt_ids)
        return list(stub.Generate(req, timeout=120))


def _tokenize(address: str, text: str) -> list[int]:
    with grpc.insecure_channel(address) as channel:
        reply = pb_grpc.GenerationServiceStub(channel).Tokenize(
            pb.TokenizeRequest(text=text), timeout=30
        )
        return list(reply.token_ids)


def _scrape(url: str) -> set[str]:
    text = httpx.get(url, timeout=10).text
    return {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_the_rendered_release_serves_through_its_declared_wiring(release: LocalRelease) -> None:
    # Startup: every pod's first startup probe failed (nothing listens yet), then succeeded.
    for role, seen in release.startup.items():
        assert not seen[0].ok and seen[-1].ok, (role, seen)
    # Each pod built the demo model itself (its own emptyDir), byte for byte the same.
    digests = {
        hashlib.sha256((_demo_folder(release, r) / "model.safetensors").read_bytes()).hexdigest()
        for r in ("router", "prefill", "decode")
    }
    assert len(digests) == 1
    folder = _demo_folder(release, "decode")
    http_url, grpc_address = _router(release)
    model = "demo-llama-v1"

    # gRPC through the router: greedy token ids equal HF generate on the same folder.
    prompt = "The capital of France is"
    ids = _tokenize(grpc_address, prompt)
    expected = hf_greedy(folder, ids, N)
    msgs = _grpc_generate(grpc_address, ids)
    assert [t for m in msgs for t in m.token_ids] == expected
    assert msgs[-1].finished and msgs[-1].finish_reason == "length"
    text = "".join(m.text for m in msgs)

    # OpenAI HTTP through the router, with the openai client: the same text.
    client = openai.OpenAI(base_url=f"{http_url}/v1", api_key="unused", timeout=120)
    out = client.completions.create(
        model=model, prompt=prompt, max_tokens=N, temperature=0, extra_body={"ignore_eos": True}
    )
    assert out.choices[0].text == text and out.usage is not None
    assert out.usage.prompt_tokens == len(ids) and out.usage.completion_tokens == N
    chunks = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=N,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed

    # Serving: every declared probe of every pod answers as the chart expects.
    for role, pod in release.pods.items():
        for kind in PROBES:
            result = run_probe(pod, kind)
            assert result.ok, (role, kind, result)
    health = httpx.get(f"{http_url}/health", timeout=10).json()
    assert health["status"] == "ok" and health["model"] == model
    # The images' HEALTHCHECK script finds each process's gRPC health from its command line.
    for role, pod in release.pods.items():
        assert pod.process is not None
        r = subprocess.run(
            [sys.executable, str(HEALTHCHECK), "--pid", str(pod.process.pid)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert r.returncode == 0 and r.stdout.strip().endswith("SERVING"), (role, r.stderr)

    # Metrics, found as the ServiceMonitors find them; every autoscaling metric of every
    # pool's choices (HPA and KEDA) is a series these processes really export.
    exported: set[str] = set()
    for sm in by_kind(release.objs, "ServiceMonitor"):
        role = sm["metadata"]["labels"]["app.kubernetes.io/component"]
        (svc,) = [
            s
            for s in by_kind(release.objs, "Service")
            if s["metadata"]["name"] == sm["metadata"]["name"]
        ]
        for endpoint in sm["spec"]["endpoints"]:
            # the Service port the endpoint names, and the pod port it targets
            (port,) = [p for p in svc["spec"]["ports"] if p["name"] == endpoint["port"]]
            local = release.pods[role].ports[port["targetPort"]]
            exported |= _scrape(f"http://{LOOPBACK}:{local}{endpoint['path']}")
    raw = {n for n in all_scaling_metric_names() if ":" not in n}
    assert raw and raw <= exported, raw - exported


def test_decode_probes_during_drain(tmp_path: Path) -> None:
    """The chart's contract: once SIGTERM arrives, a worker's readiness service turns
    NOT_SERVING (the Service stops sending work) while liveness ("") stays SERVING until the
    process exits within terminationGracePeriodSeconds. Observed on a decode pod with a long
    stream in flight through the router (an idle worker drains at once: nothing to watch)."""
    rel = LocalRelease(cpu_tiny(), tmp_path)
    try:
        rel.start(["router", "prefill", "decode"])
        rel.wait_ready()
        pod = rel.pods["decode"]
        http_url, _ = _router(rel)
        first = threading.Event()

        def stream() -> None:
            body = {"prompt": "Hello", "max_tokens": 1500, "stream": True, "ignore_eos": True}
            with httpx.stream("POST", f"{http_url}/v1/completions", json=body, timeout=120) as r:
                for _ in r.iter_lines():
                    first.set()

        client = threading.Thread(target=stream, daemon=True)
        client.start()
        assert first.wait(60), "the stream never started"
        pod.terminate()
        draining = []
        while pod.is_running():
            # Liveness first: a readiness NOT_SERVING after it proves the server was still up
            # (draining, not stopped) when liveness was asked.
            live, ready = run_probe(pod, "livenessProbe"), run_probe(pod, "readinessProbe")
            if ready.detail == "NOT_SERVING":
                draining.append(live)
        client.join(60)
        assert draining, "readiness never reported NOT_SERVING before the process exited"
        assert all(live.ok for live in draining), draining
    except AssertionError as e:
        raise AssertionError(f"{e}\n{rel.logs()}") from None
    finally:
        rel.stop()
