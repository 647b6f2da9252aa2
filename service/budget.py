"""Budgets of memory in flight, on the event loop only (asyncio.Condition). A request takes its share
before the memory is used and gives it back when done; one that does not fit waits, and after `wait`
seconds gets 503 overloaded. Two are kept: decoded pixels (`PixelBudget`: memory grows with decoded
pixels, not bytes — a 1.5 KB lossless WebP can decode to 40 MP, 120 MB of BGR — so an image's pixels
are held from before its decode until its faces are embedded) and request bodies (`BodyBudget`,
charged by `service.api.admission` as a body arrives and held until its answer).

`CostLanes` keeps cheap images from waiting behind costly ones: an image's cost (its pixels after
the header check) is known before its decode, so images above a threshold go through a lane of
their own, narrower than the engine's threads, and every client (`CLIENT`: its key, else its
address) may have only so many pixels in flight (counted for every worker process of a host by its
model host, `SharedTally`); a normal photo never queues behind them."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import AsyncIterator
from concurrent.futures import Future
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import Protocol, runtime_checkable

from service.core.errors import ModelUnavailable, Overloaded

TALLY_WAIT = 1.0  # seconds a worker waits for its host's answer to a `take`, then treats the host as away


class Budget:
    def __init__(self, capacity: int, wait: float, setting: str):
        """`setting`: how the budget is named in the 503 (the setting that sizes it, and its value)."""
        self.capacity = capacity
        self.free = capacity
        self.wait = wait
        self.setting = setting
        self._changed = asyncio.Condition()

    async def acquire(self, amount: int, wait: float | None = None) -> int:
        """Take `amount` (capped at the whole budget: a request larger than it runs alone), waiting
        up to `wait` seconds (the budget's own by default); what was taken, to be given back with `release`."""
        amount = min(amount, self.capacity)
        wait = self.wait if wait is None else wait
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(lambda: self.free >= amount), wait)
            except asyncio.TimeoutError:
                raise Overloaded(f"the {self.setting} stayed spent for {wait:g} s; retry later") from None
            self.free -= amount
        return amount

    async def release(self, amount: int) -> None:
        # Shielded: a request cancelled again while this waits for the lock (anyio's cancel scopes
        # cancel every await until they are left) would otherwise never give its share back.
        await asyncio.shield(self._release(amount))

    @asynccontextmanager
    async def hold(self, amount: int) -> AsyncIterator[None]:
        taken = await self.acquire(amount)
        try:
            yield
        finally:
            await self.release(taken)

    async def _release(self, amount: int) -> None:
        async with self._changed:
            self.free += amount
            self._changed.notify_all()


class PixelBudget(Budget):
    def __init__(self, megapixels: float, wait: float):
        super().__init__(int(megapixels * 1_000_000), wait, f"decoded-image budget (FACEGATE_MAX_DECODED_MEGAPIXELS={megapixels:g})")


class BodyBudget(Budget):
    def __init__(self, megabytes: float, wait: float):
        super().__init__(int(megabytes * 1_000_000), wait, f"request-body budget (FACEGATE_MAX_BODY_MEGABYTES={megabytes:g})")


# Who a request is for admission and fairness: "key <digest prefix>" for a keyed request, else
# "address <ip>"; set by service.api.middleware.ApiKeyAuth before anything else runs.
CLIENT: ContextVar[str] = ContextVar("facegate_client", default="unknown")


@runtime_checkable
class SharedTally(Protocol):
    """Per-client counts every worker process of a host shares (the model host's: `HostedModels`)."""

    def take(self, client: str, amount: int, cap: int) -> Future: ...
    def give(self, client: str, amount: int) -> None: ...


async def take_shared(shared: SharedTally, client: str, amount: int, cap: int, wait: float = TALLY_WAIT) -> bool:
    """`shared.take`, its send off the event loop (it may wait on the link's lock) and its answer
    waited for `wait` seconds at most: a host that does not answer in time (hung, starved, restarting)
    is ModelUnavailable, never a request held without bound. What the host granted after the caller
    stopped waiting (timed out, or its request cancelled) is given back, else the host-wide count
    would stay short of it until this worker's connection ends."""
    sending = asyncio.ensure_future(asyncio.to_thread(shared.take, client, amount, cap))
    try:
        asked = await asyncio.shield(sending)
        return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(asked)), wait)
    except BaseException as exc:
        sending.add_done_callback(lambda sent: _give_back_when_granted(shared, client, amount, sent))
        if isinstance(exc, TimeoutError):
            raise ModelUnavailable(f"the model host did not answer within {wait:g} s; retry shortly", retry_after=1) from None
        raise


def _give_back_when_granted(shared: SharedTally, client: str, amount: int, sent: asyncio.Future) -> None:
    if sent.cancelled() or sent.exception() is not None:
        return

    def granted(answer: Future) -> None:
        if not answer.cancelled() and answer.exception() is None and answer.result():
            threading.Thread(target=shared.give, args=(client, amount), name="facegate-tally-give", daemon=True).start()

    sent.result().add_done_callback(granted)


class CostLanes:
    def __init__(
        self, threshold_megapixels: float, width: int, per_client_megapixels: float, wait: float, shared: SharedTally | None = None
    ):
        """Images above `threshold_megapixels` run at most `width` at a time (waiting up to `wait`
        seconds, then 503); a client's images in flight, of any cost, are capped at
        `per_client_megapixels` (beyond it 503 at once, though one image always fits), counted
        across the host's worker processes where `shared` is given, else in this process."""
        self.threshold = int(threshold_megapixels * 1_000_000)
        self.per_client = int(per_client_megapixels * 1_000_000)
        self.costly = Budget(width, wait, f"lane of images above FACEGATE_COSTLY_MEGAPIXELS={threshold_megapixels:g} ({width} at a time)")
        self.shared = shared
        self.in_flight: Counter[str] = Counter()  # pixels by client, on the event loop only (without `shared`)

    async def _take(self, client: str, pixels: int) -> bool:
        if self.shared is not None:  # a host that cannot answer (in time) fails it with 503
            return await take_shared(self.shared, client, pixels, self.per_client)
        if self.in_flight[client] and self.in_flight[client] + pixels > self.per_client:
            return False
        self.in_flight[client] += pixels
        return True

    def _give(self, client: str, pixels: int) -> None:
        if self.shared is not None:
            asyncio.get_running_loop().run_in_executor(None, self.shared.give, client, pixels)  # off the loop, like take
            return
        self.in_flight[client] -= pixels
        if self.in_flight[client] <= 0:
            del self.in_flight[client]

    @asynccontextmanager
    async def enter(self, pixels: int) -> AsyncIterator[None]:
        client = CLIENT.get()
        if not await self._take(client, pixels):
            raise Overloaded(
                f"this client already has images in flight up to FACEGATE_CLIENT_MEGAPIXELS={self.per_client / 1e6:g}; "
                f"retry in {Overloaded.retry_after} s"
            )
        try:
            if pixels > self.threshold:
                async with self.costly.hold(1):
                    yield
            else:
                yield
        finally:
            self._give(client, pixels)
