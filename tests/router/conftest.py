"""One server per mode per test process (xdist worker) for every module that needs the
standard configuration: tests in one process run one at a time, so each may assert that the
whole KV pool is free; starting a server is the slow part of these tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from protos.pdserve.v1 import generate_pb2_grpc as pb_grpc
from tests.conftest import TINY_ARCHS
from tests.router.secured_mode import API_KEY, assert_secured, secured_setup
from tests.router.server_access import Access
from tests.router.server_harness import Server, start_server

MAX_MODEL_LEN = 1024
NUM_KV_BLOCKS = 64  # 64 x 16 = 1024 tokens: one request at max_model_len fills the pool
MODES = ["colocated", "disaggregated", "secured"]


@pytest.fixture(scope="session")
def llama(model_factory) -> Path:  # type: ignore[no-untyped-def]
    return model_factory("llama", **TINY_ARCHS["llama"])


@pytest.fixture(scope="session", params=MODES)
def server(
    request: pytest.FixtureRequest, llama: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """Every API test runs against three modes: one engine in the router process; router +
    prefill worker + decode worker processes with the KV moving over TCP; and that again with
    every security option on (tests/router/secured_mode.py: an API key, TLS with client
    certificates on the router's ports, mutual TLS to the workers and on the KV channel). The
    tests reach the server only through its clients (``Server.http``, ``.openai``,
    ``.grpc_channel`` ...), which carry what each mode asks for."""
    mode = request.param
    flags: tuple[str, ...] = ()
    access = Access()
    if mode == "secured":
        setup = secured_setup(tmp_path_factory.mktemp("secured"))
        flags, access = setup.flags, setup.access
    if mode != "colocated":
        flags += ("--kv-transport", "tcp")
    s = start_server(
        llama,
        "--num-kv-blocks", str(NUM_KV_BLOCKS), "--max-model-len", str(MAX_MODEL_LEN), *flags,
        colocated=mode == "colocated",
        access=access,
    )  # fmt: skip
    try:
        if mode == "secured":
            assert_secured(s)  # once: the suite cannot run unsecured by mistake
        yield s
    finally:
        assert s.stop() == 0, "".join(s.lines)
    logs = "".join(s.lines)
    assert "pdserve: stopped" in logs
    assert API_KEY not in logs  # keys are never logged


@pytest.fixture(scope="module")
def stub(server: Server) -> Iterator[pb_grpc.GenerationServiceStub]:
    """A gRPC client of the module's server (GenerationService), with what its mode asks for."""
    with server.grpc_channel() as channel:
        yield pb_grpc.GenerationServiceStub(channel)
