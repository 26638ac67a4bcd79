"""The control-plane flags of a worker process (``--redis-url``, ``--worker-id``, ...) and
what they resolve to. Imports nothing heavy: the CLI and the chart's flag list read them."""

from __future__ import annotations

import argparse
import socket
import urllib.parse
from pathlib import Path

# The registration's lease, and how often a worker renews it (and reports its load and KV
# events). 3 s lapsed under a loaded CI machine's late heartbeats (every worker dropped: "no
# decode worker available"); etcd-backed registries commonly use 10 s too.
REGISTRY_LEASE_S = 10.0
HEARTBEAT_S = 0.6


def add_control_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("control plane")
    g.add_argument(
        "--redis-url",
        default=None,
        help="register in this Redis (redis://host:port/db or rediss:// for TLS) so routers "
        "find this worker; default: none (routers list workers with --decode/--prefill)",
    )
    g.add_argument(
        "--redis-password-file",
        default=None,
        help="a file holding the Redis password (kept out of the URL, logs and process list)",
    )
    g.add_argument("--redis-ca-file", default=None, help="CA bundle for a rediss:// URL")
    g.add_argument(
        "--cluster-name",
        default="default",
        help="the registry namespace: routers and workers of one deployment share it",
    )
    g.add_argument(
        "--worker-id",
        default=None,
        help="this worker's id in the registry (a Kubernetes pod passes its name; a restart "
        "with the same id fences the old process); default: role + random suffix",
    )
    g.add_argument(
        "--advertise-host",
        default=None,
        help="the host other processes reach this worker at (default: --host, or this "
        "machine's name when --host is 0.0.0.0)",
    )
    g.add_argument(
        "--registry-lease-s",
        type=float,
        default=REGISTRY_LEASE_S,
        help="the registration lapses when not renewed for this long (default "
        f"{REGISTRY_LEASE_S:g}: a loaded worker's late heartbeats must not drop it from "
        "routing; a killed worker's refused calls send requests elsewhere at once)",
    )
    g.add_argument(
        "--registry-heartbeat-s",
        type=float,
        default=None,
        help="renew the lease, report load and publish KV events this often (default: "
        f"{HEARTBEAT_S:g}, or a fifth of a shorter --registry-lease-s)",
    )


def heartbeat_of(a: argparse.Namespace) -> float:
    """``--registry-heartbeat-s``, or its default for ``--registry-lease-s``; raises
    ``ValueError`` unless it is positive and below the lease."""
    heartbeat_s: float = a.registry_heartbeat_s or min(HEARTBEAT_S, a.registry_lease_s / 5)
    if not 0 < heartbeat_s < a.registry_lease_s:
        raise ValueError(
            f"--registry-heartbeat-s ({heartbeat_s:g}) must be positive and below "
            f"--registry-lease-s ({a.registry_lease_s:g})"
        )
    return heartbeat_s


def redis_url_of(a: argparse.Namespace) -> str | None:
    """``--redis-url`` with the password from ``--redis-password-file`` and the CA from
    ``--redis-ca-file`` folded in (redis-py reads both from the URL)."""
    url: str | None = a.redis_url
    if not url:
        return None
    parts = urllib.parse.urlsplit(url)
    netloc, query = parts.netloc, parts.query
    if a.redis_password_file:
        password = Path(a.redis_password_file).read_text().strip()
        host = netloc.rsplit("@", 1)[-1]
        user = urllib.parse.unquote(netloc.rsplit("@", 1)[0].split(":")[0]) if "@" in netloc else ""
        netloc = f"{urllib.parse.quote(user)}:{urllib.parse.quote(password, safe='')}@{host}"
    if a.redis_ca_file:
        extra = urllib.parse.urlencode({"ssl_ca_certs": a.redis_ca_file})
        query = f"{query}&{extra}" if query else extra
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def advertised_address(a: argparse.Namespace, port: int) -> str:
    host = a.advertise_host or a.host
    if host in ("0.0.0.0", "::", ""):
        host = socket.getfqdn()
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def control_defaults(host: str = "127.0.0.1") -> argparse.Namespace:
    """The flags' defaults (a worker started from code, not from its command line)."""
    p = argparse.ArgumentParser()
    add_control_args(p)
    a = p.parse_args([])
    a.host = host
    return a
