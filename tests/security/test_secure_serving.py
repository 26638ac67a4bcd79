"""`pdserve serve` (router + prefill + decode processes) with every security option on: API
keys from a file, HTTPS and gRPC TLS on the router, mutual TLS from the router to both
workers and on the KV channel. Real clients: the openai client, grpcurl, grpc channels with
and without certificates; a stranger's ticket; key rotation. Every pool is free afterwards."""

from __future__ import annotations

import asyncio
import json
import re
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import openai
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from engine.sampling_params import SamplingParams
from kv_transfer.errors import KVTransferError
from kv_transfer.tcp import TcpConnector
from pdserve.tls import ClientTls, client_ssl_context, open_channel
from pdserve.wire import sampling_params_to_proto
from protos.pdserve.v1 import generate_pb2 as gpb
from protos.pdserve.v1 import generate_pb2_grpc as gpb_grpc
from protos.pdserve.v1 import kv_transfer_pb2 as kvpb
from protos.pdserve.v1 import worker_pb2 as wpb
from protos.pdserve.v1 import worker_pb2_grpc
from tests.conftest import TINY_ARCHS
from tests.hf_oracle import hf_greedy
from tests.router.server_harness import Server, start_server
from tests.security.certs import Authority, CertFiles, authority

KEY_A, KEY_B, KEY_C = "sk-pdserve-test-alpha-1f3e", "sk-pdserve-test-beta-77c0", "sk-rotated-9a"
WRONG_KEY = "sk-not-a-key-at-all-5d2b"


@dataclass
class Pki:
    release: Authority
    stranger: Authority
    router: CertFiles
    worker: CertFiles
    foreign: CertFiles  # signed by another CA
    expired: CertFiles  # signed by the release's CA, expired


@dataclass
class Secured:
    server: Server
    model: Path
    pki: Pki
    key_file: Path
    decode: str  # gRPC targets, from the workers' startup lines
    prefill: str


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    release, stranger = authority(d, "release"), authority(d, "stranger")
    return Pki(
        release,
        stranger,
        router=release.issue("router"),
        worker=release.issue("worker"),
        foreign=stranger.issue("foreign"),
        expired=release.issue("expired", expired=True),
    )


def _verify(pki: Pki) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=pki.release.ca_file)


@pytest.fixture(scope="module")
def secured(model_factory, pki: Pki, tmp_path_factory) -> Iterator[Secured]:  # type: ignore[no-untyped-def]
    model = model_factory("llama", **TINY_ARCHS["llama"])
    key_file = tmp_path_factory.mktemp("keys") / "api-keys"
    key_file.write_text(f"# the test's keys\n{KEY_A}\n{KEY_B}\n")
    srv = start_server(
        model,
        "--num-kv-blocks", "128", "--max-model-len", "512", "--kv-transport", "tcp",
        "--prefill-max-num-batched-tokens", "16",
        "--api-key-file", str(key_file),
        "--tls-cert-file", pki.router.cert, "--tls-key-file", pki.router.key,
        "--worker-tls-ca-file", pki.release.ca_file,
        "--worker-tls-cert-file", pki.worker.cert, "--worker-tls-key-file", pki.worker.key,
        colocated=False,
        httpx_options={"verify": _verify(pki)},
    )  # fmt: skip
    try:
        text = "".join(srv.lines)
        decode = re.search(r"decode worker: grpc (\S+),", text)
        prefill = re.search(r"prefill worker: grpc (\S+)", text)
        assert decode and prefill, text
        assert srv.http_url.startswith("https://")
        yield Secured(srv, model, pki, key_file, decode.group(1), prefill.group(1))
    finally:
        assert srv.stop() == 0, "".join(srv.lines)
        logs = "".join(srv.lines)
        for secret in (KEY_A, KEY_B, KEY_C, WRONG_KEY):
            assert secret not in logs  # keys are never logged


def _client(s: Secured, key: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{s.server.http_url}/v1",
        api_key=key,
        http_client=openai.DefaultHttpxClient(verify=_verify(s.pki), timeout=60),
        max_retries=0,
    )


def test_openai_client_with_a_key_gets_hf_greedy_tokens(secured: Secured) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(secured.model))
    prompt = "the model serves tokens from a paged cache in the city of mutual trust"
    ids = tok.encode(prompt)
    expected = tok.decode(hf_greedy(secured.model, ids, 10))
    for key in (KEY_A, KEY_B):
        out = _client(secured, key).completions.create(
            model="tiny", prompt=prompt, max_tokens=10, temperature=0,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        assert out.choices[0].text == expected  # the KV crossed the mutual-TLS channel intact
    secured.server.wait_pool_free(timeout_s=20)


def test_no_key_or_a_wrong_key_gets_openai_401(secured: Secured) -> None:
    with pytest.raises(openai.AuthenticationError) as info:
        _client(secured, WRONG_KEY).completions.create(model="tiny", prompt="hi", max_tokens=2)
    assert info.value.status_code == 401
    assert info.value.body == {
        "message": "Incorrect API key provided.",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
    }
    url = secured.server.http_url
    verify = _verify(secured.pki)
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
    r = httpx.post(f"{url}/v1/completions", json=body, verify=verify)
    assert r.status_code == 401
    assert r.headers["www-authenticate"].startswith("Bearer")
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] is None
    assert "Authorization: Bearer" in error["message"]
    bad = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Basic {KEY_A}"}, verify=verify)
    assert bad.status_code == 401
    # Probes and scrapes need no key; everything else does.
    assert httpx.get(f"{url}/health", verify=verify).status_code == 200
    assert httpx.get(f"{url}/metrics", verify=verify).status_code == 200
    assert httpx.get(f"{url}/v1/models", verify=verify).status_code == 401
    models = httpx.get(
        f"{url}/v1/models", headers={"Authorization": f"Bearer {KEY_A}"}, verify=verify
    )
    assert models.status_code == 200
    with pytest.raises(httpx.TransportError):  # plain HTTP is not served on the TLS port
        httpx.get(url.replace("https://", "http://") + "/health", timeout=10)
    secured.server.wait_pool_free()


def test_grpc_needs_a_key_and_tls(secured: Secured) -> None:
    target = secured.server.grpc_address
    tls = ClientTls(secured.pki.release.ca_file)
    with grpc.secure_channel(target, _channel_credentials(tls)) as channel:
        stub = gpb_grpc.GenerationServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.GetModelInfo(gpb.GetModelInfoRequest(), timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as info:
            list(stub.Generate(gpb.GenerateRequest(text="hi"), timeout=10,
                               metadata=(("authorization", f"Bearer {WRONG_KEY}"),)))  # fmt: skip
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        ok = stub.GetModelInfo(
            gpb.GetModelInfoRequest(), timeout=10, metadata=(("authorization", f"Bearer {KEY_A}"),)
        )
        assert ok.model == "tiny"
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert health.status == health_pb2.HealthCheckResponse.SERVING  # open for probes
    with grpc.insecure_channel(target) as plain:  # no TLS: no answer at all
        with pytest.raises(grpc.RpcError) as info:
            health_pb2_grpc.HealthStub(plain).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def _channel_credentials(tls: ClientTls) -> grpc.ChannelCredentials:
    from pdserve.tls import grpc_channel_credentials

    return grpc_channel_credentials(tls)


def _grpcurl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["grpcurl", *args], capture_output=True, text=True, timeout=60)


def test_grpcurl_with_cacert_and_a_key(secured: Secured) -> None:
    ca, target = secured.pki.release.ca_file, secured.server.grpc_address
    method = "pdserve.v1.GenerationService/GetModelInfo"
    ok = _grpcurl("-cacert", ca, "-H", f"authorization: Bearer {KEY_B}", target, method)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["model"] == "tiny"
    no_key = _grpcurl("-cacert", ca, target, method)
    assert no_key.returncode != 0 and "Unauthenticated" in no_key.stderr
    plain = _grpcurl("-plaintext", target, method)
    assert plain.returncode != 0


def test_auth_failures_are_counted_without_the_key(secured: Secured) -> None:
    verify = _verify(secured.pki)
    url = secured.server.http_url
    httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {WRONG_KEY}"}, verify=verify)
    text = httpx.get(f"{url}/metrics", verify=verify).text
    for secret in (KEY_A, KEY_B, WRONG_KEY):
        assert secret not in text
    values = {
        (m.group(1), m.group(2)): float(m.group(3))
        for m in re.finditer(
            r'pdserve_auth_failures_total\{[^}]*protocol="(\w+)",reason="(\w+)"[^}]*\} (\S+)',
            text,
        )
    }
    assert values[("http", "invalid")] >= 1
    assert set(values) == {(p, r) for p in ("http", "grpc") for r in ("missing", "malformed",
                                                                       "invalid")}  # fmt: skip


def test_workers_accept_only_release_certificates(secured: Secured) -> None:
    pki = secured.pki
    ca = pki.release.ca_file
    refused = {
        "no client certificate": ClientTls(ca),
        "another CA's certificate": ClientTls(ca, pki.foreign.cert, pki.foreign.key),
        "an expired certificate": ClientTls(ca, pki.expired.cert, pki.expired.key),
    }
    for target, stub_cls in (
        (secured.decode, worker_pb2_grpc.DecodeWorkerStub),
        (secured.prefill, worker_pb2_grpc.PrefillWorkerStub),
    ):
        for why, tls in refused.items():
            with grpc.secure_channel(target, _channel_credentials(tls)) as channel:
                with pytest.raises(grpc.RpcError) as info:
                    stub_cls(channel).GetLoad(wpb.GetLoadRequest(), timeout=5)
                assert info.value.code() == grpc.StatusCode.UNAVAILABLE, why
        with grpc.insecure_channel(target) as plain:
            with pytest.raises(grpc.RpcError):
                stub_cls(plain).GetLoad(wpb.GetLoadRequest(), timeout=5)
        if stub_cls is worker_pb2_grpc.DecodeWorkerStub:  # and a stranger cannot reserve
            tls = refused["another CA's certificate"]
            with grpc.secure_channel(target, _channel_credentials(tls)) as channel:
                request = wpb.WorkerGenerateRequest(
                    request_id="stranger", prompt_token_ids=[1, 2, 3],
                    sampling_params=sampling_params_to_proto(SamplingParams(max_tokens=2)),
                )  # fmt: skip
                with pytest.raises(grpc.RpcError):
                    list(stub_cls(channel).Generate(request, timeout=5))
    secured.server.wait_pool_free()


def _release_tls(s: Secured) -> ClientTls:
    return ClientTls(s.pki.release.ca_file, s.pki.worker.cert, s.pki.worker.key)


def test_decode_kv_listener_refuses_senders_without_a_release_certificate(
    secured: Secured,
) -> None:
    async def scenario() -> None:
        channel = open_channel(secured.decode, _release_tls(secured))
        load = await worker_pb2_grpc.DecodeWorkerStub(channel).GetLoad(wpb.GetLoadRequest())
        await channel.close()
        endpoint = load.kv_endpoint
        assert endpoint.startswith("tcp://") and load.transport == "tcp"
        hello = kvpb.KVHello(sender_id=1)
        stranger = ClientTls(secured.pki.release.ca_file, secured.pki.foreign.cert,
                             secured.pki.foreign.key)  # fmt: skip
        for connector in (TcpConnector(), TcpConnector(client_ssl_context(stranger))):
            with pytest.raises((KVTransferError, ConnectionError, OSError, TimeoutError)):
                channel = await connector.connect(endpoint, hello, 5.0)
                await channel.close()
        # A sender that trusts another CA does not talk to decode either.
        wrong_ca = ClientTls(secured.pki.stranger.ca_file, secured.pki.foreign.cert,
                             secured.pki.foreign.key)  # fmt: skip
        with pytest.raises(KVTransferError, match="TLS handshake"):
            await TcpConnector(client_ssl_context(wrong_ca)).connect(endpoint, hello, 5.0)

    asyncio.run(asyncio.wait_for(scenario(), 60))
    secured.server.wait_pool_free()


def test_prefill_refuses_a_ticket_for_a_stranger_endpoint(secured: Secured) -> None:
    ticket = kvpb.KVReservation(
        request_id="stranger", endpoint="tcp://127.0.0.1:9", token=b"\x01" * 16,
        block_ids=[0], lease_s=5.0,
    )  # fmt: skip
    request = wpb.PrefillRequest(
        request_id="stranger", prompt_token_ids=[1, 2, 3, 4],
        sampling_params=sampling_params_to_proto(SamplingParams(max_tokens=1)),
        reservation=ticket,
    )  # fmt: skip
    with grpc.secure_channel(secured.prefill, _channel_credentials(_release_tls(secured))) as ch:
        with pytest.raises(grpc.RpcError) as info:
            worker_pb2_grpc.PrefillWorkerStub(ch).Prefill(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "not one of this prefill worker's decode workers" in (info.value.details() or "")
    secured.server.wait_pool_free()


def test_key_file_rotates_without_restart(secured: Secured) -> None:
    url, verify = secured.server.http_url, _verify(secured.pki)

    def status(key: str) -> int:
        headers = {"Authorization": f"Bearer {key}"}
        return httpx.get(f"{url}/v1/models", headers=headers, verify=verify).status_code

    assert status(KEY_C) == 401
    secured.key_file.write_text(f"{KEY_C}\n")
    deadline = time.monotonic() + 30
    while status(KEY_C) != 200 or status(KEY_A) != 401:
        assert time.monotonic() < deadline, "the key file was not reloaded"
        time.sleep(0.2)
    secured.key_file.write_text("")  # an empty file is refused: the keys in use stay
    time.sleep(3)
    assert status(KEY_C) == 200
    metrics = httpx.get(f"{url}/metrics", verify=verify).text
    assert re.search(r'pdserve_auth_key_reloads_total\{[^}]*result="ok"[^}]*\} [1-9]', metrics)
    assert re.search(r'pdserve_auth_key_reloads_total\{[^}]*result="error"[^}]*\} [1-9]', metrics)
    secured.key_file.write_text(f"{KEY_A}\n{KEY_B}\n")
    deadline = time.monotonic() + 30
    while status(KEY_A) != 200:
        assert time.monotonic() < deadline
        time.sleep(0.2)
