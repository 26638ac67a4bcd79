"""A gRPC listener's certificate files are replaced while it serves: the next handshake uses
the new certificate (grpc's dynamic credentials); a pair that does not load keeps the old."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from pdserve.tls import RELOAD_CHECK_S, ClientTls, ServerTls, add_port, open_channel
from tests.security.certs import authority


async def _check(port: int, tls: ClientTls) -> bool:
    channel = open_channel(f"127.0.0.1:{port}", tls)
    try:
        stub = health_pb2_grpc.HealthStub(channel)
        await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
        return True
    except grpc.aio.AioRpcError as e:
        assert e.code() == grpc.StatusCode.UNAVAILABLE
        return False
    finally:
        await channel.close()


def test_rotated_server_certificate_is_served_without_restart(tmp_path: Path) -> None:
    old, new = authority(tmp_path, "old"), authority(tmp_path, "new")
    client = old.issue("client")
    live = ServerTls(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"), old.ca_file)
    first = old.issue("server")
    shutil.copy(first.cert, live.cert_file)
    shutil.copy(first.key, live.key_file)
    trusts_old = ClientTls(old.ca_file, client.cert, client.key)
    trusts_new = ClientTls(new.ca_file, client.cert, client.key)

    async def scenario() -> None:
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
        port = add_port(server, "127.0.0.1:0", live)
        await server.start()
        try:
            assert await _check(port, trusts_old) and not await _check(port, trusts_new)
            # A half-written rotation (new certificate, old key) is not taken.
            second = new.issue("server-2")
            shutil.copy(second.cert, live.cert_file)
            await asyncio.sleep(RELOAD_CHECK_S + 0.2)
            assert await _check(port, trusts_old)
            shutil.copy(second.key, live.key_file)
            deadline = asyncio.get_running_loop().time() + 10
            while not await _check(port, trusts_new):
                assert asyncio.get_running_loop().time() < deadline, "never reloaded"
                await asyncio.sleep(0.2)
            assert not await _check(port, trusts_old)
        finally:
            await server.stop(0)

    asyncio.run(asyncio.wait_for(scenario(), 60))
