"""The rendered objects agree with one another: Service and NetworkPolicy ports are container
ports, probes call the ports the processes listen on, the router's targets are the worker
Services, budgets and autoscalers follow the values, rules and dashboards are the files."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from pdserve.chart.roles import DecodeAutoscaling, PrefillAutoscaling, RouterAutoscaling
from tests.helm.chart import (
    CHART,
    EXAMPLES,
    NAMESPACE,
    by_kind,
    containers,
    example_values,
    named,
    objects,
    render,
    render_example,
    workloads,
)
from tests.observability.assets import RULE_FILES, recorded_names, selectors

ROLES = ("router", "prefill", "decode")


def _objs(example: str) -> list[dict[str, Any]]:
    return objects(render_example(example))


def _selected(objs: list[dict[str, Any]], match: dict[str, str]) -> list[dict[str, Any]]:
    """The workloads whose pods carry every label of ``match``."""
    return [
        w
        for w in workloads(objs)
        if match.items() <= w["spec"]["template"]["metadata"]["labels"].items()
    ]


def _container_ports(workload: dict[str, Any]) -> dict[str, int]:
    return {
        p["name"]: p["containerPort"]
        for c in workload["spec"]["template"]["spec"]["containers"]
        for p in c.get("ports", [])
    }


def _flag(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


@pytest.mark.parametrize("example", EXAMPLES)
def test_service_ports_are_container_ports(example: str) -> None:
    objs = _objs(example)
    for svc in by_kind(objs, "Service"):
        (target,) = _selected(objs, svc["spec"]["selector"])  # exactly one workload
        ports = _container_ports(target)
        for p in svc["spec"]["ports"]:
            assert p["targetPort"] in ports, (svc["metadata"]["name"], p)
            if p["name"] == p["targetPort"]:
                assert p["port"] == ports[p["targetPort"]]  # same number inside and out
            else:  # the router's metrics alias of its HTTP port
                assert (p["name"], p["targetPort"]) == ("metrics", "http")


@pytest.mark.parametrize("example", EXAMPLES)
def test_network_policies_cover_exactly_the_container_ports(example: str) -> None:
    objs = _objs(example)
    covered: dict[str, set[str]] = {}
    release = {"app.kubernetes.io/instance": "pdserve", "app.kubernetes.io/name": "pdserve"}
    ucx = example_values(example).get("kvTransfer", {}).get("transport") == "ucx"
    for np in by_kind(objs, "NetworkPolicy"):
        (target,) = _selected(objs, np["spec"]["podSelector"]["matchLabels"])
        role = target["metadata"]["labels"]["app.kubernetes.io/component"]
        ports = _container_ports(target)
        for rule in np["spec"]["ingress"]:
            names = {p["port"] for p in rule.get("ports", [])} or set(ports)
            assert names <= set(ports), (np["metadata"]["name"], names)
            covered.setdefault(role, set()).update(names)
            if role == "router":
                continue
            if names & {"grpc", "kv", "redis"} or not rule.get("ports"):
                # Worker APIs, KV and Redis: only this release's own pods.
                assert rule["from"] == [{"podSelector": {"matchLabels": release}}], rule
        assert set(ports) == covered[role], f"{role}: ports no policy admits"
    expected = {"router", "prefill", "decode"} | (
        {"redis"} if by_kind(objs, "StatefulSet") else set()
    )
    assert set(covered) == expected
    if ucx:  # UCX picks its own ports: the workers' rule has none, release pods only
        decode = named(objs, "NetworkPolicy", "pdserve-decode")
        assert "ports" not in decode["spec"]["ingress"][0]


@pytest.mark.parametrize("example", EXAMPLES)
def test_probes_and_args_use_the_declared_ports(example: str) -> None:
    objs = _objs(example)
    for c in containers(objs):
        if c.init or c.role == "redis":
            continue
        ports = {p["name"]: p["containerPort"] for p in c.spec["ports"]}
        args = c.spec["args"]
        # Behind TLS the kubelet's gRPC probe cannot talk to the port: an open port is alive.
        tls = "--tls-cert-file" in args
        for probe in ("startupProbe", "livenessProbe"):
            if tls:
                assert c.spec[probe]["tcpSocket"] == {"port": ports["grpc"]}
            else:
                assert c.spec[probe]["grpc"] == {"port": ports["grpc"]}  # service "": alive
        ready = c.spec["readinessProbe"]
        if c.role == "router":
            scheme = {"scheme": "HTTPS"} if tls else {}
            assert ready["httpGet"] == {"path": "/health", "port": "http", **scheme}
            assert int(_flag(args, "--http-port")) == ports["http"]
            assert int(_flag(args, "--grpc-port")) == ports["grpc"]
        else:
            service = {"prefill": "pdserve.v1.PrefillWorker", "decode": "pdserve.v1.DecodeWorker"}
            if tls:
                assert ready["tcpSocket"] == {"port": ports["grpc"]}
            else:
                assert ready["grpc"] == {"port": ports["grpc"], "service": service[c.role]}
            assert int(_flag(args, "--port")) == ports["grpc"]
            assert int(_flag(args, "--metrics-port")) == ports["metrics"]
            assert _flag(args, "--host") == "$(POD_IP)"
        if c.role == "decode":
            assert int(_flag(args, "--kv-port")) == ports["kv"]
            assert _flag(args, "--kv-host") == "$(POD_IP)"  # the address prefill dials


@pytest.mark.parametrize("example", ["cpu-tiny", "tls"])
def test_static_router_targets_are_the_worker_services(example: str) -> None:
    objs = _objs(example)
    (router,) = [c for c in containers(objs) if c.role == "router"]
    for role in ("decode", "prefill"):
        svc = named(objs, "Service", f"pdserve-{role}")
        assert svc["spec"]["clusterIP"] == "None"  # headless: the pod, not a virtual IP
        grpc = next(p["port"] for p in svc["spec"]["ports"] if p["name"] == "grpc")
        dns = f"pdserve-{role}.{NAMESPACE}.svc.cluster.local:{grpc}"
        assert _flag(router.spec["args"], f"--{role}") == dns


@pytest.mark.parametrize("example", EXAMPLES)
def test_drain_fits_the_grace_period(example: str) -> None:
    values = example_values(example)
    drain = {"seconds": 30, "preStopSleepSeconds": 5, **values.get("drain", {})}
    for c in containers(_objs(example)):
        if c.init or c.role == "redis":
            continue
        assert (
            c.pod["terminationGracePeriodSeconds"]
            >= drain["seconds"] + drain["preStopSleepSeconds"]
        )
        assert c.spec["lifecycle"]["preStop"] == {
            "sleep": {"seconds": drain["preStopSleepSeconds"]}
        }
        # The kubelet stops liveness probes once a pod is deleted, so a drain is never
        # cut short by them; the grace period is what must cover preStop + drain.
        if c.role == "router":
            assert int(_flag(c.spec["args"], "--shutdown-grace-s")) == drain["seconds"]


def test_drain_migrate_after_reaches_only_decode() -> None:
    """drain.migrateAfterSeconds: decode hands its streams to migration that long after
    SIGTERM (--drain-migrate-after-s); unset, no flag (at the grace)."""
    values = {**example_values("cpu-tiny"), "drain": {"migrateAfterSeconds": 0}}
    with_flag = {c.role: c.spec["args"] for c in containers(objects(render(values)))}
    assert _flag(with_flag["decode"], "--drain-migrate-after-s") == "0"
    for role in ("router", "prefill"):
        assert "--drain-migrate-after-s" not in with_flag[role]
    for c in containers(_objs("cpu-tiny")):
        assert "--drain-migrate-after-s" not in c.spec.get("args", [])


@pytest.mark.parametrize("example", EXAMPLES)
def test_pods_are_locked_down(example: str) -> None:
    objs = _objs(example)
    assert not by_kind(objs, "Secret"), "the chart never creates a Secret"
    for sa in by_kind(objs, "ServiceAccount"):
        assert sa["automountServiceAccountToken"] is False
    for c in containers(objs):
        assert c.pod["automountServiceAccountToken"] is False
        assert c.pod["securityContext"]["runAsNonRoot"] is True
        assert c.spec["securityContext"]["readOnlyRootFilesystem"] is True
        assert c.spec["securityContext"]["allowPrivilegeEscalation"] is False
        mounts = [m["mountPath"] for m in c.spec.get("volumeMounts", [])]
        for env in c.spec.get("env", []):
            if env["name"] in ("HOME", "XDG_CACHE_HOME", "PDSERVE_CACHE", "HF_HOME", "TMPDIR"):
                # every place a process writes is a volume: the root stays read-only
                assert any(env["value"].startswith(m) for m in mounts), (c.role, env)
            if "valueFrom" in env and "secretKeyRef" in env["valueFrom"]:
                assert set(env["valueFrom"]["secretKeyRef"]) == {"name", "key"}


def test_gpu_requests_per_vendor() -> None:
    objs = _objs("gpu-production")
    for c in containers(objs):
        limits = c.spec["resources"].get("limits", {})
        assert limits.get("nvidia.com/gpu") == (1 if c.role in ("prefill", "decode") else None)
    for vendor, key in (("amd", "amd.com/gpu"), ("intel", "gpu.intel.com/i915")):
        values = {"decode": {"gpu": {"count": 2, "vendor": vendor}}}
        (decode,) = [c for c in containers(objects(render(values))) if c.role == "decode"]
        assert decode.spec["resources"]["limits"] == {key: 2}


@pytest.mark.parametrize("example", EXAMPLES)
def test_pdbs_only_for_pools_of_two_or_more(example: str) -> None:
    values = example_values(example)
    pdbs = {p["metadata"]["name"] for p in by_kind(_objs(example), "PodDisruptionBudget")}
    for role in ROLES:
        pool = values.get(role, {})
        autoscaling = pool.get("autoscaling", {})
        scaled = any(autoscaling.get(k, {}).get("enabled") for k in ("hpa", "keda"))
        least = autoscaling.get("minReplicas", 1) if scaled else pool.get("replicas", 1)
        assert (f"pdserve-{role}" in pdbs) == (least >= 2), role


@pytest.mark.parametrize("example", EXAMPLES)
def test_autoscalers_own_the_replicas(example: str) -> None:
    objs = _objs(example)
    scaled = {
        o["spec"]["scaleTargetRef"]["name"]
        for o in by_kind(objs, "HorizontalPodAutoscaler") + by_kind(objs, "ScaledObject")
    }
    for d in by_kind(objs, "Deployment"):
        assert ("replicas" in d["spec"]) == (d["metadata"]["name"] not in scaled)
    assert scaled <= {d["metadata"]["name"] for d in by_kind(objs, "Deployment")}


def scaling_metric_names(objs: list[dict[str, Any]]) -> set[str]:
    """The pdserve metrics and recording rules the HPAs and KEDA triggers read."""
    names = set()
    for hpa in by_kind(objs, "HorizontalPodAutoscaler"):
        for m in hpa["spec"]["metrics"]:
            if m["type"] in ("Pods", "External"):
                names.add(m[m["type"].lower()]["metric"]["name"])
    for so in by_kind(objs, "ScaledObject"):
        for t in so["spec"]["triggers"]:
            if t["type"] == "prometheus":
                found = selectors(t["metadata"]["query"])
                assert found, t
                names |= {s.split("{")[0] for s in found}
    return names


def every_scaling_choice() -> list[dict[str, Any]]:
    """Values that enable each metric choice of each pool, once with HPA and once with KEDA."""
    choices = {
        "router": RouterAutoscaling.model_fields["metric"].annotation.__args__,  # type: ignore[union-attr]
        "prefill": PrefillAutoscaling.model_fields["metric"].annotation.__args__,  # type: ignore[union-attr]
        "decode": DecodeAutoscaling.model_fields["metric"].annotation.__args__,  # type: ignore[union-attr]
    }
    out = []
    for kind in ("hpa", "keda"):
        for role, metrics in choices.items():
            for metric in metrics:
                out.append(
                    {
                        "controlPlane": {"mode": "redis"},
                        role: {
                            "resources": {"requests": {"cpu": "1"}},
                            "autoscaling": {kind: {"enabled": True}, "metric": metric},
                        },
                    }
                )
    return out


def all_scaling_metric_names() -> set[str]:
    names: set[str] = set()
    for values in every_scaling_choice():
        names |= scaling_metric_names(objects(render(values)))
    return names


def test_every_scaling_metric_choice_renders_and_names_a_pdserve_series() -> None:
    names = all_scaling_metric_names()
    recorded = set(recorded_names())
    assert {n for n in names if ":" in n} <= recorded  # recording rules exist
    assert all(n.startswith("pdserve") for n in names)
    # raw metric names are checked against what the processes export in test_run_chart


def test_prometheus_rule_is_the_rule_files() -> None:
    (rule,) = by_kind(_objs("gpu-production"), "PrometheusRule")
    files = [CHART / "rules" / "recording.yaml", CHART / "rules" / "alerts.yaml"]
    assert sorted(files) == RULE_FILES  # every rule file promtool tests, and only those
    groups = [g for path in files for g in yaml.safe_load(path.read_text())["groups"]]
    assert rule["spec"]["groups"] == groups


def test_dashboards_are_the_dashboard_files() -> None:
    maps = by_kind(_objs("gpu-production"), "ConfigMap")
    files = sorted((CHART / "dashboards").glob("*.json"))
    assert len(maps) == len(files) == 3
    for cm, path in zip(sorted(maps, key=lambda m: m["metadata"]["name"]), files, strict=True):
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["namespace"] == "monitoring"
        assert json.loads(cm["data"][path.name]) == json.loads(path.read_text())


@pytest.mark.parametrize("example", EXAMPLES)
def test_scrape_objects_point_at_metrics_ports(example: str) -> None:
    objs = _objs(example)
    for sm in by_kind(objs, "ServiceMonitor"):
        svc = [
            s
            for s in by_kind(objs, "Service")
            if sm["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
        ]
        (target,) = svc
        names = {p["name"] for p in target["spec"]["ports"]}
        assert all(e["port"] in names and e["path"] == "/metrics" for e in sm["spec"]["endpoints"])
    for pm in by_kind(objs, "PodMonitor"):
        (target,) = _selected(objs, pm["spec"]["selector"]["matchLabels"])
        ports = _container_ports(target)
        assert all(e["port"] in ports for e in pm["spec"]["podMetricsEndpoints"])
