"""decode_service.heartbeat: a quiet stream carries a heartbeat about every interval, a busy
one none, and writes never interleave."""

from __future__ import annotations

import asyncio

from decode_service.heartbeat import HeartbeatWriter


def test_heartbeats_only_while_quiet_and_only_while_alive() -> None:
    written: list[tuple[float, str]] = []
    alive = [True]

    async def write(message: str) -> None:
        written.append((asyncio.get_running_loop().time(), message))
        await asyncio.sleep(0.001)  # a write takes time: a second one must wait for it

    async def main() -> None:
        async with HeartbeatWriter(write, "beat", 0.05, lambda: alive[0]) as out:
            for i in range(20):  # busy: a message every 10 ms
                await out.write(f"token {i}")
                await asyncio.sleep(0.01)
            assert all(m != "beat" for _, m in written)
            await asyncio.sleep(0.3)  # quiet: about 6 heartbeats
            beats = [t for t, m in written if m == "beat"]
            assert 3 <= len(beats) <= 8, beats
            alive[0] = False
            before = len(written)
            await asyncio.sleep(0.2)
            assert len(written) == before  # a dead engine gets no heartbeat
        await asyncio.sleep(0.1)
        assert len(written) == before  # none after the stream ended

    asyncio.run(main())
