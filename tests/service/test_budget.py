"""The decoded-pixel budget (issue 23, defect 2): holders beyond it wait, a wait past its limit is
503 overloaded, and an image larger than the whole budget still runs (alone)."""

from __future__ import annotations

import asyncio

import pytest

from service.budget import PixelBudget
from service.core.errors import Overloaded


def test_holders_beyond_the_budget_wait_and_time_out():
    async def scenario():
        budget = PixelBudget(megapixels=1.0, wait=0.2)
        async with budget.hold(600_000):
            assert budget.free == 400_000
            with pytest.raises(Overloaded):
                async with budget.hold(600_000):
                    pass
            assert budget.free == 400_000  # the refused request took nothing
        assert budget.free == 1_000_000

    asyncio.run(scenario())


def test_a_waiter_runs_once_room_is_freed_and_oversized_images_run_alone():
    async def scenario():
        budget = PixelBudget(megapixels=1.0, wait=5.0)
        order = []

        async def job(name: str, pixels: int, hold_for: float):
            async with budget.hold(pixels):
                order.append((name, budget.free))
                await asyncio.sleep(hold_for)

        await asyncio.gather(job("first", 700_000, 0.1), job("second", 5_000_000, 0.0))
        assert order == [("first", 300_000), ("second", 0)]  # the 5 MP image waited, then held all 1 MP

    asyncio.run(scenario())


def test_a_holder_cancelled_again_while_it_gives_back_its_pixels_still_gives_them_back():
    """anyio's cancel scopes cancel every await until the scope is left: a second cancellation while
    the release waited for the condition's lock lost the pixels, and the budget shrank for good."""

    async def scenario():
        budget = PixelBudget(megapixels=1.0, wait=5.0)
        entered = asyncio.Event()

        async def holder():
            async with budget.hold(600_000):
                entered.set()
                await asyncio.sleep(60)

        task = asyncio.create_task(holder())
        await entered.wait()
        async with budget._changed:  # the lock is busy (another request checking for room)
            task.cancel()
            await asyncio.sleep(0.01)  # the holder now waits for the lock to give its pixels back
            task.cancel()
            await asyncio.sleep(0.01)
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.01)
        assert budget.free == 1_000_000

    asyncio.run(scenario())
