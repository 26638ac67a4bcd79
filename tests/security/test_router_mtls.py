"""The router with mutual TLS for its clients (``--tls-client-ca-file``) and keys from
``PDSERVE_API_KEYS``: a client needs both a certificate the CA signed and a key."""

from __future__ import annotations

import json
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import openai
import pytest

from pdserve.tls import ClientTls, grpc_channel_credentials
from protos.pdserve.v1 import generate_pb2 as gpb
from protos.pdserve.v1 import generate_pb2_grpc as gpb_grpc
from tests.conftest import TINY_ARCHS
from tests.router.server_harness import Server, start_server
from tests.security.certs import CertFiles, authority

KEY = "sk-env-key-3c1d"


def _context(ca: str, client: CertFiles | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=ca)
    if client is not None:
        ctx.load_cert_chain(client.cert, client.key)
    return ctx


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, CertFiles]:
    d = tmp_path_factory.mktemp("pki")
    release, stranger = authority(d, "release"), authority(d, "stranger")
    return {
        "router": release.issue("router"),
        "client": release.issue("client"),
        "foreign": stranger.issue("foreign"),
        "expired": release.issue("expired", expired=True),
    }


@pytest.fixture(scope="module")
def server(model_factory, pki: dict[str, CertFiles]) -> Iterator[Server]:  # type: ignore[no-untyped-def]
    model: Path = model_factory("llama", **TINY_ARCHS["llama"])
    router = pki["router"]
    srv = start_server(
        model,
        "--num-kv-blocks", "64", "--max-model-len", "256",
        "--tls-cert-file", router.cert, "--tls-key-file", router.key,
        "--tls-client-ca-file", router.ca,
        httpx_options={"verify": _context(router.ca, pki["client"])},
        env_extra={"PDSERVE_API_KEYS": f"other-key,{KEY}"},
    )  # fmt: skip
    yield srv
    assert srv.stop() == 0, "".join(srv.lines)
    assert KEY not in "".join(srv.lines)


def test_http_needs_a_release_client_certificate_and_a_key(
    server: Server, pki: dict[str, CertFiles]
) -> None:
    ca = pki["router"].ca
    verify = _context(ca, pki["client"])
    client = openai.OpenAI(
        base_url=f"{server.http_url}/v1",
        api_key=KEY,
        http_client=openai.DefaultHttpxClient(verify=verify, timeout=60),
        max_retries=0,
    )
    out = client.completions.create(model="tiny", prompt="hello", max_tokens=4, temperature=0)
    assert out.choices[0].finish_reason in ("length", "stop")
    no_key = httpx.get(f"{server.http_url}/v1/models", verify=verify, timeout=10)
    assert no_key.status_code == 401  # the key is needed too
    for who in (None, "foreign", "expired"):
        ctx = _context(ca, pki[who] if who else None)
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{server.http_url}/health", verify=ctx, timeout=10).raise_for_status()
    server.wait_pool_free()


def test_grpc_needs_a_release_client_certificate_and_a_key(
    server: Server, pki: dict[str, CertFiles]
) -> None:
    ca, client = pki["router"].ca, pki["client"]
    metadata = (("authorization", f"Bearer {KEY}"),)
    good = ClientTls(ca, client.cert, client.key)
    with grpc.secure_channel(server.grpc_address, grpc_channel_credentials(good)) as channel:
        info = gpb_grpc.GenerationServiceStub(channel).GetModelInfo(
            gpb.GetModelInfoRequest(), timeout=10, metadata=metadata
        )
        assert info.model == "tiny"
    for tls in (ClientTls(ca), ClientTls(ca, pki["foreign"].cert, pki["foreign"].key)):
        with grpc.secure_channel(server.grpc_address, grpc_channel_credentials(tls)) as channel:
            with pytest.raises(grpc.RpcError) as e:
                gpb_grpc.GenerationServiceStub(channel).GetModelInfo(
                    gpb.GetModelInfoRequest(), timeout=10, metadata=metadata
                )
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE


def test_grpcurl_with_client_certificate(server: Server, pki: dict[str, CertFiles]) -> None:
    ca, client = pki["router"].ca, pki["client"]
    method = "pdserve.v1.GenerationService/GetModelInfo"
    auth = ["-H", f"authorization: Bearer {KEY}"]

    def grpcurl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["grpcurl", "-cacert", ca, *args, *auth, server.grpc_address, method],
            capture_output=True,
            text=True,
            timeout=60,
        )

    ok = grpcurl("-cert", client.cert, "-key", client.key)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["model"] == "tiny"
    for args in ((), ("-cert", pki["foreign"].cert, "-key", pki["foreign"].key)):
        refused = grpcurl(*args)
        assert refused.returncode != 0 and "model" not in refused.stdout
