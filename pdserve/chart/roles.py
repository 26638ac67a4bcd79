"""Values of the three roles (router, prefill, decode): ports, flags and autoscaling."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, create_model

from pdserve.chart.flags import Flag, pool_flags, router_flags
from pdserve.chart.pods import Closed, Gpu, Hpa, Keda, Open, PodSettings


def _default(f: Flag) -> str:
    if f.kind == "boolean":
        return "a switch: true passes it"
    return "pdserve default: unset" if f.default is None else f"pdserve default: {f.default}"


def flags_model(name: str, flags: list[Flag]) -> type[BaseModel]:
    """A closed values object with one optional key per flag (unset = pdserve's default)."""
    fields: dict[str, Any] = {
        f.key: (
            f.python_type(),
            Field(default=None, description=f"{f.flag} ({_default(f)}) {f.help}".strip()),
        )
        for f in flags
    }
    return create_model(name, __base__=Closed, **fields)  # type: ignore[call-overload,no-any-return]


PoolFlags = flags_model("PoolFlags", pool_flags())
RouterFlags = flags_model("RouterFlags", router_flags())


class Autoscaling(Closed):
    """HPA or KEDA (never both) on one metric pdserve exports; see docs/kubernetes.md."""

    min_replicas: int = Field(default=1, ge=1)
    max_replicas: int = Field(default=4, ge=1)
    target: float | None = Field(
        default=None,
        gt=0,
        description="the metric's target (default: per metric, docs/kubernetes.md)",
    )
    hpa: Hpa = Field(default_factory=Hpa)
    keda: Keda = Field(default_factory=Keda)


class RouterAutoscaling(Autoscaling):
    metric: Literal["inflightRequests", "cpu"] = Field(
        default="inflightRequests",
        description="inflightRequests: admitted requests per router; cpu: CPU utilization %",
    )


class PrefillAutoscaling(Autoscaling):
    metric: Literal["waitingRequests", "prefillQueueP95", "ttftP95"] = Field(
        default="waitingRequests",
        description="waitingRequests: queued prompts per worker; prefillQueueP95: p95 wait "
        "in prefill's queue (s); ttftP95: p95 time to first token (s)",
    )


class DecodeAutoscaling(Autoscaling):
    metric: Literal["kvUsage", "itlP95"] = Field(
        default="kvUsage",
        description="kvUsage: KV-block usage per worker (0..1); itlP95: p95 inter-token "
        "latency (s)",
    )


class RouterPorts(Closed):
    http: int = Field(default=8000, ge=1, le=65535, description="OpenAI HTTP, /health, /metrics")
    grpc: int = Field(default=50051, ge=1, le=65535, description="pdserve.v1.GenerationService")


class PrefillPorts(Closed):
    grpc: int = Field(default=50071, ge=1, le=65535, description="pdserve.v1.PrefillWorker")
    metrics: int = Field(default=9400, ge=1, le=65535)


class DecodePorts(Closed):
    grpc: int = Field(default=50061, ge=1, le=65535, description="pdserve.v1.DecodeWorker")
    kv: int = Field(default=50062, ge=1, le=65535, description="KV pages in (TCP transport)")
    metrics: int = Field(default=9400, ge=1, le=65535)


class RouterService(Closed):
    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = "ClusterIP"
    metrics_port: int = Field(
        default=9400,
        ge=1,
        le=65535,
        description="the Service's metrics port (the router serves /metrics on its HTTP port)",
    )
    annotations: dict[str, str] = Field(default_factory=dict)
    load_balancer_source_ranges: list[str] = Field(default_factory=list)


class Router(PodSettings):
    ports: RouterPorts = Field(default_factory=RouterPorts)
    service: RouterService = Field(default_factory=RouterService)
    flags: RouterFlags = Field(  # type: ignore[valid-type]
        default_factory=RouterFlags, description="`pdserve router` flags"
    )
    autoscaling: RouterAutoscaling = Field(default_factory=RouterAutoscaling)


class Worker(PodSettings):
    gpu: Gpu = Field(default_factory=Gpu)
    shm_size_limit: str = Field(
        default="",
        description="mount a memory-backed /dev/shm of this size (e.g. 8Gi); empty: none",
    )
    flags: PoolFlags = Field(  # type: ignore[valid-type]
        default_factory=PoolFlags, description="engine flags for this pool (over `engine`)"
    )


class Prefill(Worker):
    ports: PrefillPorts = Field(default_factory=PrefillPorts)
    autoscaling: PrefillAutoscaling = Field(default_factory=PrefillAutoscaling)


class Decode(Worker):
    ports: DecodePorts = Field(default_factory=DecodePorts)
    autoscaling: DecodeAutoscaling = Field(default_factory=DecodeAutoscaling)


__all__ = ["Decode", "Open", "Prefill", "Router"]
