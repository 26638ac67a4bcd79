"""A rendered release run as local processes: one LocalPod per workload, the Services mapped
to the ports of the pods they select, started together as a Deployment rollout would."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.helm.chart import NAMESPACE, by_kind, workloads
from tests.helm.local_pod import Cluster, LocalPod
from tests.helm.probes import ProbeResult, wait_probes
from tests.sockets import free_ports


def port_values() -> dict[str, Any]:
    """Values giving every port of the three roles a free local port (in a cluster each pod
    has its own IP and they may share numbers; here they share one address)."""
    p = free_ports(7)
    return {
        "router": {"ports": {"http": p[0], "grpc": p[1]}},
        "prefill": {"ports": {"grpc": p[2], "metrics": p[3]}},
        "decode": {"ports": {"grpc": p[4], "kv": p[5], "metrics": p[6]}},
    }


def _pod_labels(w: dict[str, Any]) -> dict[str, str]:
    return dict(w["spec"]["template"]["metadata"]["labels"])


def _pod_spec(w: dict[str, Any]) -> dict[str, Any]:
    pod = dict(w["spec"]["template"]["spec"])
    # A StatefulSet's claim templates give each pod a fresh claim: a fresh directory here.
    templates = w["spec"].get("volumeClaimTemplates", [])
    pod["volumes"] = [
        *pod.get("volumes", []),
        *({"name": t["metadata"]["name"], "emptyDir": {}} for t in templates),
    ]
    return pod


def service_addresses(objs: list[dict[str, Any]]) -> dict[str, int]:
    """'<service>.<ns>.svc.cluster.local:<port>' -> the selected pod's container port."""
    out = {}
    for svc in by_kind(objs, "Service"):
        sel = svc["spec"]["selector"]
        (target,) = [w for w in workloads(objs) if sel.items() <= _pod_labels(w).items()]
        ports = {
            p["name"]: p["containerPort"]
            for c in target["spec"]["template"]["spec"]["containers"]
            for p in c.get("ports", [])
        }
        dns = f"{svc['metadata']['name']}.{NAMESPACE}.svc.cluster.local"
        for p in svc["spec"]["ports"]:
            target_port = p["targetPort"]
            out[f"{dns}:{p['port']}"] = (
                ports[target_port] if isinstance(target_port, str) else target_port
            )
    return out


@dataclass
class LocalRelease:
    objs: list[dict[str, Any]]
    root: Path
    cluster: Cluster = field(default_factory=Cluster)
    pods: dict[str, LocalPod] = field(default_factory=dict)  # by role
    startup: dict[str, list[ProbeResult]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.cluster.services = service_addresses(self.objs)

    def start(self, roles: Iterable[str]) -> None:
        """Start the main container of each role's workload, all at once."""
        for w in workloads(self.objs):
            role = w["metadata"]["labels"]["app.kubernetes.io/component"]
            if role not in roles:
                continue
            spec = _pod_spec(w)
            assert not spec.get("initContainers"), "init containers are not run here"
            (container,) = spec["containers"]
            name = f"{w['metadata']['name']}-0"
            self.pods[role] = LocalPod(name, spec, container, self.root / name, self.cluster)
        for pod in self.pods.values():
            pod.start()

    def wait_ready(self) -> None:
        """Startup probes of every pod, then their readiness probes (the router is ready
        only once it sees healthy workers)."""
        self.startup = wait_probes(self.pods, "startupProbe")
        wait_probes(self.pods, "readinessProbe")

    def stop(self) -> None:
        for pod in self.pods.values():
            pod.terminate()
        for pod in self.pods.values():
            pod.stop()

    def logs(self) -> str:
        return "\n".join(p.log_tail() for p in self.pods.values())
