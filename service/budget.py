"""Budgets of memory in flight, on the event loop only (asyncio.Condition). A request takes its share
before the memory is used and gives it back when done; one that does not fit waits, and after `wait`
seconds gets 503 overloaded. Two are kept: decoded pixels (`PixelBudget`: memory grows with decoded
pixels, not bytes — a 1.5 KB lossless WebP can decode to 40 MP, 120 MB of BGR — so an image's pixels
are held from before its decode until its faces are embedded) and request bodies (`BodyBudget`,
held by `service.api.admission` from before a body is read until its answer)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from service.core.errors import Overloaded


class Budget:
    def __init__(self, capacity: int, wait: float, setting: str):
        """`setting`: how the budget is named in the 503 (the setting that sizes it, and its value)."""
        self.capacity = capacity
        self.free = capacity
        self.wait = wait
        self.setting = setting
        self._changed = asyncio.Condition()

    async def acquire(self, amount: int) -> int:
        """Take `amount` (capped at the whole budget: a request larger than it runs alone); what was
        taken, to be given back with `release`."""
        amount = min(amount, self.capacity)
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(lambda: self.free >= amount), self.wait)
            except asyncio.TimeoutError:
                raise Overloaded(f"the {self.setting} stayed spent for {self.wait:g} s; retry later") from None
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
