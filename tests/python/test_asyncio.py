"""asyncio: awaiting transfers and immediate counters without blocking the event loop."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

import accord



def test_await_transfers_and_counters(pair: tuple[accord.Engine, accord.Engine]) -> None:
    a, b = pair

    async def main() -> int:
        src, dst = np.arange(8192, dtype=np.uint8) % 251, np.zeros(8192, dtype=np.uint8)
        with a.register(src) as s, b.register(dst) as d:
            waiter = asyncio.ensure_future(b.imm_counter(61).wait_async(4))
            transfers = [a.write(s, d.descriptor, 2048, src_offset=i * 2048, dst_offset=i * 2048, imm=61) for i in range(4)]
            await asyncio.gather(*transfers)
            value = await asyncio.wait_for(waiter, timeout=10)
            assert (dst == src).all()
            return value

    assert asyncio.run(main()) == 4


def test_loop_keeps_running_while_a_counter_is_awaited(engine: accord.Engine) -> None:
    async def main() -> tuple[int, int]:
        ticks = 0
        done = False

        async def ticker() -> None:
            nonlocal ticks
            while not done:
                ticks += 1
                await asyncio.sleep(0.001)

        task = asyncio.ensure_future(ticker())
        with engine.alloc(64) as s, engine.alloc(64) as d:
            # A write from another thread, later: the loop must stay live meanwhile.
            threading.Timer(0.2, lambda: engine.write(s, d.descriptor, imm=62)).start()
            value = await asyncio.wait_for(engine.imm_counter(62).wait_async(1), timeout=10)
        done = True
        await task
        return value, ticks

    value, ticks = asyncio.run(main())
    assert value == 1 and ticks > 10


def test_awaiting_a_failed_transfer_raises(engine: accord.Engine) -> None:
    async def main() -> None:
        with engine.alloc(64) as s:
            d = engine.alloc(64)
            descriptor = d.descriptor
            d.close()
            await engine.write(s, descriptor)

    with pytest.raises(accord.RemoteAccessError):
        asyncio.run(main())


def test_await_with_timeout_cancels_cleanly() -> None:
    a = accord.Engine(force_network=True, idle_timeout=0.5, ignore_env=True)
    b = accord.Engine(force_network=True, ignore_env=True)
    a.add_peer(b.address)
    d = b.alloc(64).descriptor
    b.close()

    async def main() -> None:
        with a.alloc(64) as s:
            t = a.write(s, d)
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.ensure_future(_await(t)), timeout=0.05)
            with pytest.raises(accord.PeerError):
                await t  # finishes with the peer's failure after the idle timeout

    asyncio.run(main())
    a.close()


async def _await(t: accord.Transfer) -> None:
    await t
