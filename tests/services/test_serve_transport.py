"""``pdserve serve``'s choice of KV transport: "auto" takes TCP when a worker is pinned to one
CPU (UCX stalled decode's token stream there, docs/kv_transfer.md); explicit choices stay."""

from __future__ import annotations

from pdserve.launch import parse_cpus, serve_kv_transport


def test_auto_is_kept_without_single_cpu_pinning() -> None:
    assert serve_kv_transport("auto", None, None) == ("auto", None)
    assert serve_kv_transport("auto", parse_cpus("0,1"), parse_cpus("2,3")) == ("auto", None)


def test_auto_takes_tcp_when_a_worker_has_one_cpu() -> None:
    transport, why = serve_kv_transport("auto", parse_cpus("1"), parse_cpus("0"))
    assert transport == "tcp" and why is not None and "--kv-transport ucx" in why
    assert serve_kv_transport("auto", None, parse_cpus("0"))[0] == "tcp"


def test_an_explicit_transport_is_never_overridden() -> None:
    assert serve_kv_transport("ucx", parse_cpus("1"), parse_cpus("0")) == ("ucx", None)
    assert serve_kv_transport("tcp", None, None) == ("tcp", None)
