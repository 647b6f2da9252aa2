"""A budget of decoded pixels in flight. Memory grows with decoded pixels, not bytes: a 1.5 KB
lossless WebP can decode to 40 MP (120 MB of BGR). An image's pixels are held from before its decode
until its faces are embedded; a request that does not fit waits, and after `wait` seconds gets 503
overloaded. Used on the event loop only (asyncio.Condition)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from service.core.errors import Overloaded


class PixelBudget:
    def __init__(self, megapixels: float, wait: float):
        self.capacity = int(megapixels * 1_000_000)
        self.free = self.capacity
        self.wait = wait
        self._changed = asyncio.Condition()

    @asynccontextmanager
    async def hold(self, pixels: int) -> AsyncIterator[None]:
        # An image larger than the whole budget (a setting below FACEGATE_MAX_IMAGE_PIXELS) runs alone.
        pixels = min(pixels, self.capacity)
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(lambda: self.free >= pixels), self.wait)
            except asyncio.TimeoutError:
                raise Overloaded(
                    f"the decoded-image budget (FACEGATE_MAX_DECODED_MEGAPIXELS={self.capacity / 1e6:g}) "
                    f"stayed spent for {self.wait:g} s; retry later"
                ) from None
            self.free -= pixels
        try:
            yield
        finally:
            # Shielded: a request cancelled again while this waits for the lock (anyio's cancel scopes
            # cancel every await until they are left) would otherwise never give its pixels back.
            await asyncio.shield(self._release(pixels))

    async def _release(self, pixels: int) -> None:
        async with self._changed:
            self.free += pixels
            self._changed.notify_all()
