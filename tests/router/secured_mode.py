"""The API suite's "secured" server mode: ``pdserve serve`` disaggregated with every security
option on. Clients need an API key (from a key file) and a client certificate, and speak TLS
to the router's HTTP and gRPC ports; the router dials its workers over mutual TLS and the KV
pages move over mutual-TLS TCP. One CA, made in the test (tests/security/certs.py), signs every
certificate.

``assert_secured`` checks the mode's premise once, at start, so the suite cannot pass against
a server that quietly lets everyone in."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import httpx
import openai
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kv_transfer.errors import KVTransferError
from kv_transfer.tcp import TcpConnector
from protos.pdserve.v1 import generate_pb2 as pb
from protos.pdserve.v1 import generate_pb2_grpc as pb_grpc
from protos.pdserve.v1 import kv_transfer_pb2 as kvpb
from protos.pdserve.v1 import worker_pb2 as wpb
from protos.pdserve.v1 import worker_pb2_grpc
from tests.router.server_access import Access
from tests.router.server_harness import Server
from tests.security.certs import authority

API_KEY = "sk-pdserve-api-suite-5e0c7a91"  # asserted absent from the server's logs
WRONG_KEY = "sk-pdserve-api-suite-wrong-41d2"


@dataclass(frozen=True)
class SecuredSetup:
    flags: tuple[str, ...]  # for `pdserve serve`
    access: Access  # what the suite's clients carry


def secured_setup(path: Path) -> SecuredSetup:
    """Certificates and the key file under ``path``; the flags that turn everything on."""
    ca = authority(path, "api-suite")
    router, worker, client = ca.issue("router"), ca.issue("worker"), ca.issue("client")
    key_file = path / "api-keys"
    key_file.write_text(f"# the API suite's key\n{API_KEY}\n")
    flags = (
        "--api-key-file", str(key_file),
        "--tls-cert-file", router.cert, "--tls-key-file", router.key,
        "--tls-client-ca-file", ca.ca_file,
        "--worker-tls-ca-file", ca.ca_file,
        "--worker-tls-cert-file", worker.cert, "--worker-tls-key-file", worker.key,
    )  # fmt: skip
    return SecuredSetup(flags, Access(API_KEY, ca.ca_file, client.cert, client.key))


def assert_secured(server: Server) -> None:
    """Nobody without the key, TLS and a certificate gets in, at any port of the release."""
    assert server.http_url.startswith("https://"), server.http_url
    _assert_http_needs_key_tls_and_certificate(server)
    _assert_grpc_needs_key_and_tls(server)
    _assert_workers_need_mutual_tls(server)


def _assert_http_needs_key_tls_and_certificate(server: Server) -> None:
    verify = server.access.ssl_context()  # trusts the router, presents the client certificate
    no_certificate = replace(server.access, cert_file=None, key_file=None).ssl_context()
    assert verify is not None and no_certificate is not None
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
    with httpx.Client(base_url=server.http_url, verify=verify, timeout=30) as c:  # no key
        r = c.post("/v1/completions", json=body)
        assert r.status_code == 401, r.text
        assert "Authorization: Bearer" in r.json()["error"]["message"]
        assert c.get("/v1/models").status_code == 401
        wrong = c.get("/v1/models", headers={"Authorization": f"Bearer {WRONG_KEY}"})
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    with server.http() as c:
        assert c.get("/v1/models").status_code == 200  # the suite's own clients get in
    wrong_client = openai.OpenAI(
        base_url=f"{server.http_url}/v1",
        api_key=WRONG_KEY,
        max_retries=0,
        http_client=openai.DefaultHttpxClient(verify=verify, timeout=30),
    )
    with pytest.raises(openai.AuthenticationError) as refused:
        wrong_client.models.list()
    assert refused.value.status_code == 401
    with pytest.raises(httpx.TransportError):  # TLS, but no client certificate
        httpx.get(f"{server.http_url}/health", verify=no_certificate, timeout=10)
    with pytest.raises(httpx.TransportError):  # plain HTTP on the TLS port
        httpx.get(server.http_url.replace("https://", "http://") + "/health", timeout=10)


def _assert_grpc_needs_key_and_tls(server: Server) -> None:
    creds = server.access.grpc_credentials(with_key=False)
    assert creds is not None
    request = pb.GetModelInfoRequest()
    with grpc.secure_channel(server.grpc_address, creds) as channel:  # TLS, no key
        with pytest.raises(grpc.RpcError) as refused:
            pb_grpc.GenerationServiceStub(channel).GetModelInfo(request, timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with server.grpc_channel() as channel:
        assert pb_grpc.GenerationServiceStub(channel).GetModelInfo(request, timeout=10).model
    _assert_grpc_plaintext_refused(server.grpc_address, health_pb2_grpc.HealthStub)


def _assert_grpc_plaintext_refused(target: str, stub_cls: Any) -> None:
    """A plaintext channel gets no answer (the port speaks only TLS)."""
    with grpc.insecure_channel(target) as plain:
        stub = stub_cls(plain)
        with pytest.raises(grpc.RpcError) as refused:
            if stub_cls is health_pb2_grpc.HealthStub:
                stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
            else:
                stub.GetLoad(wpb.GetLoadRequest(), timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, target


def _assert_workers_need_mutual_tls(server: Server) -> None:
    text = "".join(server.lines)
    decode = re.search(r"decode worker: grpc (\S+), kv (\S+) \((\w+)\)", text)
    prefill = re.search(r"prefill worker: grpc (\S+)", text)
    assert decode and prefill, text
    assert decode.group(3) == "tcp", decode.group(0)  # the KV channel is TCP (with TLS)
    _assert_grpc_plaintext_refused(decode.group(1), worker_pb2_grpc.DecodeWorkerStub)
    _assert_grpc_plaintext_refused(prefill.group(1), worker_pb2_grpc.PrefillWorkerStub)

    async def plain_kv_sender() -> None:
        channel = await TcpConnector().connect(decode.group(2), kvpb.KVHello(sender_id=1), 5.0)
        await channel.close()

    with pytest.raises((KVTransferError, ConnectionError, OSError, TimeoutError)):
        asyncio.run(plain_kv_sender())
