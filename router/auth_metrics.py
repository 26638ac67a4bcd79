"""Counters of refused authentication, by protocol and reason (never the key)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from router.auth import AuthFailure


class AuthMetrics:
    def __init__(self, registry: CollectorRegistry, role: str, model: str) -> None:
        self._failures = Counter(
            "pdserve_auth_failures_total",
            "Requests refused for a missing, malformed or unknown API key.",
            ["role", "model", "protocol", "reason"],
            registry=registry,
        )
        self._reloads = Counter(
            "pdserve_auth_key_reloads_total",
            "Reloads of the API key file, by result (ok: its keys are in use; error: the "
            "previous keys stay).",
            ["role", "model", "result"],
            registry=registry,
        )
        self._labels = {"role": role, "model": model}
        for protocol in ("http", "grpc"):  # every series exists from the start
            for failure in AuthFailure:
                self._failures.labels(**self._labels, protocol=protocol, reason=failure.value)
        for result in ("ok", "error"):
            self._reloads.labels(**self._labels, result=result)

    def failed(self, protocol: str, failure: AuthFailure) -> None:
        self._failures.labels(**self._labels, protocol=protocol, reason=failure.value).inc()

    def reloaded(self, ok: bool) -> None:
        self._reloads.labels(**self._labels, result="ok" if ok else "error").inc()
