"""asyncio support: ``await transfer`` and ``await counter.wait_async(target)``.

The engine completes transfers on its completion thread; these helpers register a callback
there that resolves an asyncio future through ``loop.call_soon_threadsafe``, so the event loop
never blocks and never polls.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from accord._accord import ImmCounter, Transfer


def _resolve(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _waker(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any]) -> Any:
    def wake(value: Any) -> None:
        try:
            loop.call_soon_threadsafe(_resolve, future, value)
        except RuntimeError:
            pass  # the loop was closed meanwhile: nobody is waiting any more

    return wake


async def wait_transfer(transfer: Transfer) -> None:
    """Waits for ``transfer`` without blocking the loop; raises its error if it failed."""
    if not transfer.done():
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        transfer.add_done_callback(_waker(loop, future))
        await future
    transfer.wait(0)


async def wait_counter(counter: ImmCounter, target: int) -> int:
    """Waits until ``counter`` reaches ``target`` without blocking the loop; its value then."""
    if counter.value >= target:
        return counter.value
    loop = asyncio.get_running_loop()
    future: asyncio.Future[int] = loop.create_future()
    counter.add_callback(target, _waker(loop, future))
    return await future
