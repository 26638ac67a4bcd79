"""The kubelet's probe handlers, run against local pods: gRPC health (grpc.health.v1 via
grpcio), HTTP GET (httpx), exec (the command, with the container's env) and TCP."""

from __future__ import annotations

import socket
import subprocess
import time
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.helm.local_pod import LOOPBACK, LocalPod


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    detail: str  # "SERVING", "NOT_SERVING", "HTTP 503", "UNAVAILABLE", "exit 1", ...


def _port(pod: LocalPod, port: int | str) -> int:
    return pod.ports[port] if isinstance(port, str) else int(port)


def _grpc(pod: LocalPod, action: dict[str, Any], timeout: float) -> ProbeResult:
    target = f"{LOOPBACK}:{_port(pod, action['port'])}"
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(
                health_pb2.HealthCheckRequest(service=action.get("service", "")), timeout=timeout
            )
        except grpc.RpcError as e:
            return ProbeResult(False, e.code().name)
    name = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return ProbeResult(reply.status == health_pb2.HealthCheckResponse.SERVING, name)


def _http(pod: LocalPod, action: dict[str, Any], timeout: float) -> ProbeResult:
    url = f"http://{LOOPBACK}:{_port(pod, action['port'])}{action.get('path', '/')}"
    try:
        r = httpx.get(url, timeout=timeout)
    except httpx.HTTPError as e:
        return ProbeResult(False, type(e).__name__)
    return ProbeResult(200 <= r.status_code < 400, f"HTTP {r.status_code}")


def _exec(pod: LocalPod, action: dict[str, Any], timeout: float) -> ProbeResult:
    command = pod.exec_argv([pod.cluster.map_addresses(str(a)) for a in action["command"]])
    try:
        r = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return ProbeResult(False, "timeout")
    return ProbeResult(r.returncode == 0, f"exit {r.returncode}: {r.stdout.strip()}")


def _tcp(pod: LocalPod, action: dict[str, Any], timeout: float) -> ProbeResult:
    try:
        with socket.create_connection((LOOPBACK, _port(pod, action["port"])), timeout=timeout):
            return ProbeResult(True, "connected")
    except OSError as e:
        return ProbeResult(False, type(e).__name__)


HANDLERS = {"grpc": _grpc, "httpGet": _http, "exec": _exec, "tcpSocket": _tcp}


def run_probe(pod: LocalPod, kind: str) -> ProbeResult:
    """Call the pod's declared ``kind`` probe ("startupProbe", ...) once. A probe the
    container does not declare succeeds, as the kubelet treats it."""
    if kind not in pod.container:
        return ProbeResult(True, "not declared")
    probe = pod.container[kind]
    (handler,) = [h for h in HANDLERS if h in probe]
    return HANDLERS[handler](pod, probe[handler], float(probe.get("timeoutSeconds", 1)))


def wait_probes(
    pods: dict[str, LocalPod], kind: str, poll_s: float = 0.25
) -> dict[str, list[ProbeResult]]:
    """Call every pod's ``kind`` probe until each succeeds, all pods side by side (the kubelet
    probes each pod on its own), within the budget the spec gives the kubelet
    (periodSeconds x failureThreshold; polled more often than the kubelet would).
    Returns every result seen per pod; raises if a budget runs out or a process exits."""
    start = time.monotonic()
    seen: dict[str, list[ProbeResult]] = {name: [] for name in pods}
    while True:
        pending = [n for n in pods if not (seen[n] and seen[n][-1].ok)]
        if not pending:
            return seen
        for name in pending:
            pod = pods[name]
            if not pod.is_running():
                raise AssertionError(f"{pod.name} exited during its {kind}\n{pod.log_tail()}")
            result = run_probe(pod, kind)
            seen[name].append(result)
            probe = pod.container.get(kind, {})
            budget = probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)
            if not result.ok and time.monotonic() - start > budget:
                raise AssertionError(
                    f"{pod.name}: {kind} failed for {budget}s ({result.detail})\n{pod.log_tail()}"
                )
        time.sleep(poll_s)


def wait_probe(pod: LocalPod, kind: str) -> list[ProbeResult]:
    return wait_probes({pod.name: pod}, kind)[pod.name]
