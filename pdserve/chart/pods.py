"""Values shared by the chart's workloads: pod placement, probes, autoscaling, disruption."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

Open = dict[str, Any]  # a Kubernetes object pdserve does not own: passed through as given


class Closed(BaseModel):
    """A values object pdserve owns: unknown keys (typos) are refused by the schema."""

    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True
    )


class Probe(Closed):
    period_seconds: int = Field(ge=1, description="how often the kubelet probes")
    failure_threshold: int = Field(ge=1, description="failures in a row before it acts")
    timeout_seconds: int = Field(default=2, ge=1, description="one probe's deadline")


class Probes(Closed):
    """The probe handlers are fixed by the chart (gRPC health or /health); their timing is
    yours. Startup must cover loading the model: ``periodSeconds x failureThreshold``."""

    startup: Probe = Field(
        default=Probe(period_seconds=5, failure_threshold=120),
        description="until the process serves (workers: model loaded); 10 min by default",
    )
    readiness: Probe = Field(
        default=Probe(period_seconds=5, failure_threshold=2),
        description="in the Service's endpoints only while it answers SERVING",
    )
    liveness: Probe = Field(
        default=Probe(period_seconds=10, failure_threshold=6, timeout_seconds=5),
        description="restarted after this many failures (not probed once the pod is deleted)",
    )


class TopologySpread(Closed):
    enabled: bool = Field(default=True, description="spread this role's pods over topologyKeys")
    max_skew: int = Field(default=1, ge=1)
    topology_keys: list[str] = Field(
        default=["kubernetes.io/hostname", "topology.kubernetes.io/zone"],
        description="one constraint per key, each selecting this role's pods of this release",
    )
    when_unsatisfiable: Literal["ScheduleAnyway", "DoNotSchedule"] = "ScheduleAnyway"


class Hpa(Closed):
    enabled: bool = Field(default=False, description="a HorizontalPodAutoscaler (autoscaling/v2)")
    behavior: Open = Field(default_factory=dict, description="HPA spec.behavior, as given")


class Keda(Closed):
    enabled: bool = Field(
        default=False, description="a KEDA ScaledObject with a Prometheus trigger"
    )
    polling_interval: int = Field(default=15, ge=1, description="seconds between KEDA's queries")
    cooldown_period: int = Field(default=300, ge=0, description="seconds before scaling to min")


class Pdb(Closed):
    enabled: bool = Field(default=True, description="rendered only when the pool runs 2+ replicas")
    max_unavailable: int | str = Field(default=1, description="pods that may be evicted at once")


class Gpu(Closed):
    count: int = Field(default=0, ge=0, description="GPUs per pod (0: CPU only)")
    vendor: Literal["nvidia", "amd", "intel"] = Field(
        default="nvidia", description="nvidia.com/gpu, amd.com/gpu or gpu.intel.com/i915"
    )


class PodSettings(Closed):
    """Placement and extras every role takes."""

    replicas: int = Field(default=1, ge=0, description="pods (ignored while an autoscaler is on)")
    resources: Open = Field(default_factory=dict, description="container resources, as given")
    node_selector: dict[str, str] = Field(default_factory=dict)
    affinity: Open = Field(default_factory=dict)
    tolerations: list[Open] = Field(default_factory=list)
    topology_spread: TopologySpread = Field(default_factory=TopologySpread)
    extra_topology_spread_constraints: list[Open] = Field(default_factory=list)
    priority_class_name: str = Field(default="", description="a PriorityClass for this role's pods")
    strategy: Open = Field(default_factory=dict, description="Deployment spec.strategy")
    pod_labels: dict[str, str] = Field(default_factory=dict)
    pod_annotations: dict[str, str] = Field(default_factory=dict)
    extra_env: list[Open] = Field(default_factory=list, description="more container env")
    extra_volumes: list[Open] = Field(default_factory=list)
    extra_volume_mounts: list[Open] = Field(default_factory=list)
    pdb: Pdb = Field(default_factory=Pdb)
    probes: Probes = Field(default_factory=Probes)
