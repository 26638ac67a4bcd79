"""The Helm chart's values, as one typed model: the source of ``values.schema.json``,
``values.yaml`` and the values reference in docs/kubernetes.md (``python -m pdserve.chart``).

Objects pdserve owns are closed (a typo such as ``decode.replicsa`` fails ``helm install``);
Kubernetes objects passed through (resources, affinity, tolerations, extra env/volumes) and
labels/annotations are open. "PENDING" marks values whose wiring is rendered but whose flags
pdserve does not have yet (docs/kubernetes.md lists them).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from pdserve.chart.flags import engine_flags
from pdserve.chart.pods import Closed, Open
from pdserve.chart.roles import Decode, Prefill, Router, flags_model

EngineFlags = flags_model("EngineFlags", engine_flags())
# What `pdserve serve` gives its workers (it defaults to priority scheduling and a larger
# prefill token budget): the chart deploys the same processes, so it defaults the same.
SERVE_ENGINE_DEFAULTS = {"schedulingPolicy": "priority"}
SERVE_PREFILL_DEFAULTS = {"maxNumBatchedTokens": 4096}
LABEL_VALUE = r"^([A-Za-z0-9][-A-Za-z0-9_.]{0,61}[A-Za-z0-9]|[A-Za-z0-9])$"


class Image(Closed):
    repository: str = Field(default="pdserve", description="built from docker/Dockerfile.<flavor>")
    tag: str = Field(default="", description="default: <appVersion>-<flavor>")
    flavor: Literal["cpu", "cuda"] = Field(default="cpu", description="cpu (torch CPU) or cuda")
    pull_policy: Literal["IfNotPresent", "Always", "Never"] = "IfNotPresent"
    pull_secrets: list[str] = Field(default_factory=list, description="Secret names")


class SecretKey(Closed):
    name: str = Field(default="", description="an existing Secret (the chart never creates one)")
    key: str = "token"


class PvcSource(Closed):
    claim_name: str = Field(default="", description="an existing claim, mounted read-only")
    sub_path: str = Field(default="", description="the model folder inside the volume")


class ImageSource(Closed):
    reference: str = Field(default="", description="an OCI image holding the model folder")
    pull_policy: Literal["IfNotPresent", "Always", "Never"] = "IfNotPresent"
    sub_path: str = Field(default="", description="the model folder inside the image")


class HfStorage(Closed):
    kind: Literal["emptyDir", "pvc"] = Field(
        default="emptyDir", description="emptyDir: each pod downloads; pvc: a shared claim"
    )
    claim_name: str = ""
    size_limit: str = Field(default="", description="emptyDir size limit, e.g. 40Gi")


class HfSource(Closed):
    repo: str = Field(default="", description="a Hugging Face model repo, e.g. Qwen/Qwen3-0.6B")
    revision: str = "main"
    token_secret: SecretKey = Field(
        default_factory=SecretKey, description="HF_TOKEN for gated models"
    )
    storage: HfStorage = Field(default_factory=HfStorage)


class Model(Closed):
    source: Literal["demo", "path", "pvc", "image", "huggingface"] = Field(
        default="demo",
        description="demo: the built-in random demo model (no download); path: a folder in "
        "the image or in extraVolumes; pvc, image (Kubernetes 1.31+), huggingface (an init "
        "container downloads it)",
    )
    served_model_name: str = Field(
        default="",
        pattern=LABEL_VALUE + "|^$",
        description="the name clients send and the metrics' model label (default: the "
        "folder's or repo's last path segment; demo-llama-v1 for the demo)",
    )
    path: str = Field(default="", description="source=path: the model folder's absolute path")
    pvc: PvcSource = Field(default_factory=PvcSource)
    image: ImageSource = Field(default_factory=ImageSource)
    huggingface: HfSource = Field(default_factory=HfSource)


class ControlPlane(Closed):
    mode: Literal["static", "redis"] = Field(
        default="static",
        description="static: the router gets the worker Services as --decode/--prefill "
        "(one worker per pool); redis: workers register in Redis (--redis-url, --worker-id) "
        "and routers follow the registry, so pools scale",
    )


class RedisImage(Closed):
    repository: str = "redis"
    tag: str = "7.4"
    pull_policy: Literal["IfNotPresent", "Always", "Never"] = "IfNotPresent"


class RedisPersistence(Closed):
    enabled: bool = Field(default=False, description="a PVC per Redis pod (else an emptyDir)")
    size: str = "1Gi"
    storage_class_name: str = ""


class RedisAuth(Closed):
    existing_secret: str = Field(default="", description="Secret with the Redis password")
    password_key: str = "password"


class RedisTls(Closed):
    enabled: bool = False
    existing_secret: str = Field(
        default="", description="Secret with ca.crt (and tls.crt, tls.key for the in-chart server)"
    )


class RedisExternal(Closed):
    url: str = Field(
        default="",
        pattern=r"^$|^rediss?://[^@/]+(/[0-9]+)?$",
        description="redis://host:port/db or rediss:// (no password: use auth)",
    )


class Redis(Closed):
    deploy: bool = Field(default=True, description="redis mode: run a one-pod Redis StatefulSet")
    image: RedisImage = Field(default_factory=RedisImage)
    port: int = Field(default=6379, ge=1, le=65535)
    resources: Open = Field(
        default_factory=lambda: {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {"memory": "512Mi"},
        }
    )
    persistence: RedisPersistence = Field(default_factory=RedisPersistence)
    external: RedisExternal = Field(
        default_factory=RedisExternal, description="used when deploy is false"
    )
    auth: RedisAuth = Field(default_factory=RedisAuth)
    tls: RedisTls = Field(default_factory=RedisTls)


class KvTransfer(Closed):
    transport: Literal["tcp", "ucx"] = Field(
        default="tcp",
        description="ucx needs the cuda image; its NetworkPolicy opens release pods' ports; "
        "tls.internal needs tcp",
    )
    allowed_peers: list[str] = Field(
        default_factory=list,
        description="prefill --kv-allowed-peers: the only KV endpoints a ticket may name "
        "(host, host:port or CIDR, e.g. the pod network); empty: any",
    )


class Drain(Closed):
    seconds: int = Field(default=30, ge=0, description="in-flight work's grace after SIGTERM")
    pre_stop_sleep_seconds: int = Field(
        default=5, ge=0, description="wait for endpoints to drop the pod before SIGTERM"
    )
    migrate_after_seconds: int | None = Field(
        default=None,
        ge=0,
        description="decode workers hand the requests still in flight this long after "
        "SIGTERM to the router, which migrates them to another decode worker "
        "(--drain-migrate-after-s); null: at the grace",
    )
    worker_grace_flag: bool = Field(
        default=False,
        description="deprecated, ignored: the workers always get --shutdown-grace-s "
        "(kept so values files that set it still install)",
    )


class ApiKeys(Closed):
    existing_secret: str = Field(
        default="",
        description="a Secret holding the accepted API keys, one per line (--api-key-file; "
        "reloaded when the Secret changes)",
    )
    key: str = "api-keys"


class Auth(Closed):
    api_keys: ApiKeys = Field(default_factory=ApiKeys)


class RouterTls(Closed):
    existing_secret: str = Field(
        default="", description="a kubernetes.io/tls Secret: HTTPS and gRPC TLS on the router"
    )
    verify_clients: bool = Field(
        default=False,
        description="clients need a certificate signed by the Secret's ca.crt (mutual TLS)",
    )


class InternalTls(Closed):
    existing_secret: str = Field(
        default="",
        description="a kubernetes.io/tls Secret with ca.crt: mutual TLS between router and "
        "workers and on the KV channel (needs kvTransfer.transport tcp)",
    )
    server_name: str = Field(
        default="pdserve-internal",
        description="a DNS name the internal certificate carries; every process checks its "
        "peers' certificates for it (KV peers are dialled by pod IP)",
    )


class Tls(Closed):
    router: RouterTls = Field(default_factory=RouterTls)
    internal: InternalTls = Field(default_factory=InternalTls)


class ServiceAccount(Closed):
    create: bool = True
    name: str = Field(default="", description="default: the release's full name")
    annotations: dict[str, str] = Field(default_factory=dict)


class NetworkPolicy(Closed):
    enabled: bool = Field(default=True, description="workers and Redis: only this release's pods")
    router_from: list[Open] = Field(
        default_factory=list, description="peers allowed to the router (empty: anyone)"
    )
    metrics_from: list[Open] = Field(
        default_factory=lambda: [{"namespaceSelector": {}}],
        description="peers allowed to the workers' metrics ports (Prometheus)",
    )


class Scrape(Closed):
    enabled: bool = False
    interval: str = "15s"
    labels: dict[str, str] = Field(
        default_factory=dict, description="e.g. release: kube-prometheus-stack"
    )


class Rule(Closed):
    enabled: bool = False
    labels: dict[str, str] = Field(default_factory=dict)


class Dashboards(Closed):
    enabled: bool = False
    namespace: str = Field(
        default="", description="where Grafana's sidecar looks (default: release)"
    )
    labels: dict[str, str] = Field(default_factory=lambda: {"grafana_dashboard": "1"})
    annotations: dict[str, str] = Field(default_factory=dict)


class Prometheus(Closed):
    server_address: str = Field(
        default="http://prometheus-operated.monitoring.svc:9090",
        description="KEDA triggers query it",
    )


class Monitoring(Closed):
    service_monitor: Scrape = Field(default_factory=Scrape)
    pod_monitor: Scrape = Field(default_factory=Scrape)
    prometheus_rule: Rule = Field(default_factory=Rule)
    grafana_dashboards: Dashboards = Field(default_factory=Dashboards)
    prometheus: Prometheus = Field(default_factory=Prometheus)


def _pod_security() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": 10001,
        "runAsGroup": 10001,
        "fsGroup": 10001,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _container_security() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


class Values(Closed):
    name_override: str = Field(default="", description="replaces the chart name in object names")
    fullname_override: str = Field(default="", description="the objects' name prefix")
    cluster_domain: str = Field(default="cluster.local", description="for the Services' DNS names")
    common_labels: dict[str, str] = Field(
        default_factory=dict, description="added to every object's labels"
    )
    common_annotations: dict[str, str] = Field(
        default_factory=dict, description="added to every object's annotations"
    )
    image: Image = Field(default_factory=Image)
    model: Model = Field(default_factory=Model)
    engine: EngineFlags = Field(  # type: ignore[valid-type]
        default_factory=lambda: EngineFlags.model_validate(SERVE_ENGINE_DEFAULTS),
        description="engine flags for both pools (block size and length reach the router)",
    )
    router: Router = Field(default_factory=Router)
    prefill: Prefill = Field(
        default_factory=lambda: Prefill.model_validate({"flags": SERVE_PREFILL_DEFAULTS})
    )
    decode: Decode = Field(default_factory=Decode)
    control_plane: ControlPlane = Field(default_factory=ControlPlane)
    redis: Redis = Field(default_factory=Redis, description="redis mode only")
    kv_transfer: KvTransfer = Field(default_factory=KvTransfer)
    drain: Drain = Field(default_factory=Drain)
    auth: Auth = Field(default_factory=Auth)
    tls: Tls = Field(default_factory=Tls)
    service_account: ServiceAccount = Field(default_factory=ServiceAccount)
    pod_security_context: Open = Field(default_factory=_pod_security)
    container_security_context: Open = Field(default_factory=_container_security)
    network_policy: NetworkPolicy = Field(default_factory=NetworkPolicy)
    monitoring: Monitoring = Field(default_factory=Monitoring)
