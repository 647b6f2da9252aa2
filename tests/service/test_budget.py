"""The decoded-pixel budget (issue 23, defect 2): holders beyond it wait, a wait past its limit is
503 overloaded, and an image larger than the whole budget still runs (alone). The cost lanes (issue
45): costly images have a lane of their own and every client a cap on pixels in flight, counted by
the host's tally, whose answer is waited for a bounded time (issue 44)."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Future

import pytest

from service.budget import CLIENT, CostLanes, PixelBudget, take_shared
from service.core.errors import ModelUnavailable, Overloaded
from tests.polling import wait_until
from tests.service.api.test_event_loop import on_event_loop


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


def _holding(lanes: CostLanes, client: str, pixels: int, entered: asyncio.Event, release: asyncio.Event):
    """A request of `client` holding an image of `pixels` until `release`."""

    async def request():
        CLIENT.set(client)
        async with lanes.enter(pixels):
            entered.set()
            await release.wait()

    return asyncio.create_task(request())


def test_costly_images_take_their_own_lane_and_cheap_ones_pass_them():
    """Issue 45 (N1): eight ~40 MP images from small files queued first come, first served ahead of
    a /verify of two LFW photos (14.6 s). Costly ones now run `width` at a time; a cheap one never waits."""

    async def scenario():
        lanes = CostLanes(threshold_megapixels=4.0, width=1, per_client_megapixels=1000.0, wait=0.2)
        release = asyncio.Event()
        first = asyncio.Event()
        running = _holding(lanes, "address 10.0.0.1", 40_000_000, first, release)
        await first.wait()
        queued = asyncio.Event()
        second = _holding(lanes, "address 10.0.0.2", 40_000_000, queued, release)
        cheap = asyncio.Event()
        verify = _holding(lanes, "key abc", 62_500, cheap, release)
        await asyncio.wait_for(cheap.wait(), 1)  # beside the costly one, at once
        assert not queued.is_set()
        with pytest.raises(Overloaded, match="FACEGATE_COSTLY_MEGAPIXELS"):
            await second  # waited its 0.2 s for the lane
        release.set()
        await asyncio.gather(running, verify)
        assert not lanes.in_flight and lanes.costly.free == 1

    asyncio.run(scenario())


def test_a_client_has_a_cap_on_pixels_in_flight_and_one_image_always_fits():
    async def scenario():
        lanes = CostLanes(threshold_megapixels=4.0, width=4, per_client_megapixels=64.0, wait=5.0)
        release = asyncio.Event()
        entered = [asyncio.Event() for _ in range(2)]
        held = [_holding(lanes, "address 10.0.0.1", 30_000_000, e, release) for e in entered]
        for e in entered:
            await e.wait()
        CLIENT.set("address 10.0.0.1")
        with pytest.raises(Overloaded, match="FACEGATE_CLIENT_MEGAPIXELS"):
            async with lanes.enter(30_000_000):
                pass
        other = asyncio.Event()
        held.append(_holding(lanes, "address 10.0.0.2", 100_000_000, other, release))  # over the cap, alone: it fits
        await asyncio.wait_for(other.wait(), 1)
        release.set()
        await asyncio.gather(*held)
        assert not lanes.in_flight

    asyncio.run(scenario())


class _LateTally:
    """A host's tally whose answers come only when the test says (`answer`), as a hung or starved host's;
    what each take and give ran on (the event loop or not) recorded."""

    def __init__(self) -> None:
        self.asked: list[Future] = []
        self.given: list[tuple[str, int]] = []
        self.on_loop: list[bool] = []

    def take(self, client: str, amount: int, cap: int) -> Future:
        self.on_loop.append(on_event_loop())
        self.asked.append(Future())
        return self.asked[-1]

    def give(self, client: str, amount: int) -> None:
        self.on_loop.append(on_event_loop())
        self.given.append((client, amount))


def test_a_host_that_does_not_answer_a_take_in_time_is_unavailable_and_its_late_grant_is_given_back():
    """A take was awaited without bound, its send on the event loop: a host slow to answer held the
    request (and, a send waiting on the link's lock, the whole loop). Now: 503 model_unavailable after
    TALLY_WAIT, and a grant that arrives later is given back, off the loop."""

    async def scenario():
        tally = _LateTally()
        started = time.monotonic()
        with pytest.raises(ModelUnavailable) as refused:
            await take_shared(tally, "address 10.0.0.1", 5, 10, wait=0.2)
        assert 0.2 <= time.monotonic() - started < 2.0 and refused.value.retry_after == 1
        tally.asked[0].set_result(True)  # the host took it after all
        await asyncio.to_thread(wait_until, lambda: tally.given == [("address 10.0.0.1", 5)], "the late grant given back")
        assert tally.on_loop == [False, False]

    asyncio.run(scenario())


def test_a_take_refused_late_or_answered_in_time_gives_nothing_back():
    async def scenario():
        tally = _LateTally()
        with pytest.raises(ModelUnavailable):
            await take_shared(tally, "c", 1, 1, wait=0.05)
        tally.asked[0].set_result(False)  # refused late: nothing was taken
        answered = asyncio.ensure_future(take_shared(tally, "c", 1, 1, wait=5.0))
        await asyncio.to_thread(wait_until, lambda: len(tally.asked) == 2, "the second take sent")
        tally.asked[1].set_result(True)
        assert await answered is True
        await asyncio.sleep(0.1)
        assert tally.given == []

    asyncio.run(scenario())


def test_a_request_cancelled_while_its_take_is_unanswered_gives_the_late_grant_back():
    async def scenario():
        tally = _LateTally()
        waiting = asyncio.ensure_future(take_shared(tally, "c", 3, 9, wait=30.0))
        await asyncio.to_thread(wait_until, lambda: len(tally.asked) == 1, "the take sent")
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        tally.asked[0].set_result(True)
        await asyncio.to_thread(wait_until, lambda: tally.given == [("c", 3)], "the grant given back")

    asyncio.run(scenario())
