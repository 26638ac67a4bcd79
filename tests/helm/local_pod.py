"""A rendered pod spec turned into a local process, the way the kubelet would start it.

What Kubernetes does and this does too: the container's ``command``/``args`` are run as
given; its env is only what the spec declares (``value``, ``fieldRef``, ``resourceFieldRef``,
``secretKeyRef``), each ``$(VAR)`` expanded from earlier vars as the kubelet expands them;
it runs as the spec's user, on a read-only root when the spec says so, with every volume
(emptyDir, PVC, Secret files) at its mountPath and nothing else writable (sandbox.py).

What stands in for the cluster, and only that: the pod IP is 127.0.0.1 (a wildcard bind
address, "0.0.0.0", binds loopback); a Service's DNS name with its port is replaced by
127.0.0.1 and the port of the pod it selects; the image's ``pdserve`` (and ``hf``) are this
venv's, first on PATH; the kernels the image builds ahead of time (``PDSERVE_KERNEL_PATH``, an
ENV of docker/Dockerfile.cpu) are this machine's kernel cache; the host's filesystem stands in
for the image's.
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernels.cpu import cache_root as kernel_cache_root
from tests.helm.sandbox import Mount, Sandbox

LOOPBACK = "127.0.0.1"
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
# Machine quirks the host's numeric libraries need (OpenBLAS on this CPU); not the chart's.
HOST_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: known vars replaced, unknown left as written, $$ -> $."""

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR.sub(one, text)


def _cpu(quantity: str) -> float:
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


@dataclass
class Cluster:
    """The stand-ins for the cluster: Service addresses, Secrets' and ConfigMaps' contents."""

    services: dict[str, int] = field(default_factory=dict)  # "dns:port" -> local port
    secrets: dict[str, dict[str, str]] = field(default_factory=dict)  # name -> key -> value
    config_maps: dict[str, dict[str, str]] = field(default_factory=dict)  # name -> key -> value
    claims: dict[str, Path] = field(default_factory=dict)  # PVC name -> directory

    def map_addresses(self, text: str) -> str:
        for address in sorted(self.services, key=len, reverse=True):
            text = text.replace(address, f"{LOOPBACK}:{self.services[address]}")
        return LOOPBACK if text == "0.0.0.0" else text


@dataclass
class LocalPod:
    name: str
    pod: dict[str, Any]
    container: dict[str, Any]
    root: Path  # this pod's directory: its volumes and its log
    cluster: Cluster
    env: dict[str, str] = field(default_factory=dict)
    mounts: dict[str, Path] = field(default_factory=dict)  # mount path -> local directory
    process: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        self._make_volumes()
        self.env = self._resolve_env()

    @property
    def ports(self) -> dict[str, int]:
        return {p["name"]: p["containerPort"] for p in self.container.get("ports", [])}

    @property
    def log(self) -> Path:
        return self.root / "log.txt"

    def _security(self, key: str, default: Any = None) -> Any:
        return self.container.get("securityContext", {}).get(
            key, self.pod.get("securityContext", {}).get(key, default)
        )

    def _make_volumes(self) -> None:
        volumes = {v["name"]: v for v in self.pod.get("volumes", [])}
        uid, group = self._security("runAsUser", 0), self._security("fsGroup", 0)
        for mount in self.container.get("volumeMounts", []):
            volume = volumes[mount["name"]]
            local = self.root / "volumes" / mount["name"]
            if "persistentVolumeClaim" in volume:
                local = self.cluster.claims[volume["persistentVolumeClaim"]["claimName"]]
            elif "secret" in volume or "configMap" in volume:
                # each key a file (or, with `items`, the listed keys at their paths)
                local.mkdir(parents=True, exist_ok=True)
                if "secret" in volume:
                    source = volume["secret"]
                    data = self.cluster.secrets[source["secretName"]]
                else:
                    source = volume["configMap"]
                    data = self.cluster.config_maps[source["name"]]
                items = source.get("items") or [{"key": k, "path": k} for k in data]
                paths = {i["key"]: i["path"] for i in items}
                for key, path in paths.items():
                    (local / path).write_text(data[key])
            elif "emptyDir" in volume:
                local.mkdir(parents=True, exist_ok=True)
                os.chown(local, uid, group)  # the kubelet gives fsGroup the volume
            else:
                raise NotImplementedError(f"volume {mount['name']}: {sorted(volume)}")
            self.mounts[mount["mountPath"]] = local

    @property
    def sandbox(self) -> Sandbox:
        mounts = tuple(
            Mount(self.mounts[m["mountPath"]], m["mountPath"], bool(m.get("readOnly")))
            for m in self.container.get("volumeMounts", [])
        )
        return Sandbox(
            self.root / "sandbox",
            mounts,
            self._security("runAsUser", 0),
            self._security("runAsGroup", 0),
            bool(self._security("readOnlyRootFilesystem", False)),
        )

    def _field(self, path: str) -> str:
        return {"status.podIP": LOOPBACK, "metadata.name": self.name}[path]

    def _resource(self, ref: dict[str, Any]) -> str:
        if ref["resource"] != "limits.cpu":
            raise NotImplementedError(ref)
        limit = self.container.get("resources", {}).get("limits", {}).get("cpu")
        cpus = _cpu(str(limit)) if limit else float(os.cpu_count() or 1)
        return str(math.ceil(cpus / _cpu(str(ref.get("divisor", "1")))))

    def _resolve_env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for var in self.container.get("env", []):
            if "value" in var:
                value = expand(str(var["value"]), env)
            elif "fieldRef" in var["valueFrom"]:
                value = self._field(var["valueFrom"]["fieldRef"]["fieldPath"])
            elif "resourceFieldRef" in var["valueFrom"]:
                value = self._resource(var["valueFrom"]["resourceFieldRef"])
            else:
                ref = var["valueFrom"]["secretKeyRef"]
                value = self.cluster.secrets[ref["name"]][ref["key"]]
            env[var["name"]] = self.cluster.map_addresses(value)
        return env

    def argv(self) -> list[str]:
        args = [expand(str(a), self.env) for a in self.container.get("args", [])]
        return [*self.container["command"], *(self.cluster.map_addresses(a) for a in args)]

    def process_env(self) -> dict[str, str]:
        path = os.pathsep.join([str(Path(sys.executable).parent), os.defpath])
        host = {k: os.environ[k] for k in HOST_ENV if k in os.environ}
        image = {"PATH": path, "PDSERVE_KERNEL_PATH": str(kernel_cache_root())}
        return {**image, **host, **self.env}

    def exec_argv(self, argv: list[str]) -> list[str]:
        """``argv`` inside this running pod's container (for exec probes)."""
        assert self.process is not None
        return self.sandbox.exec_command(self.process.pid, argv, self.process_env())

    def start(self) -> None:
        venv = Path(sys.executable).parent
        for target in self.mounts:
            if venv.is_relative_to(target):
                raise AssertionError(
                    f"the host's Python ({venv}) is under {target}, which the pod mounts a "
                    "volume over: its processes could not find pdserve (use a venv elsewhere)"
                )
        self.root.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                self.sandbox.command(self.argv(), self.process_env()),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                start_new_session=True,
            )

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def terminate(self) -> None:
        """What deleting the pod does after preStop: SIGTERM."""
        if self.is_running():
            assert self.process is not None
            self.process.send_signal(signal.SIGTERM)

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after the pod's terminationGracePeriodSeconds."""
        if self.process is None:
            return None
        self.terminate()
        try:
            return self.process.wait(timeout=self.pod.get("terminationGracePeriodSeconds", 30))
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            return self.process.wait()

    def log_tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return f"--- {self.name} ---\n" + "\n".join(text.splitlines()[-lines:])
