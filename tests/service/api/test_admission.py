"""Admission control and the middleware around it, driven as ASGI directly (issue 34): requests whose
key is not yet known have slots of their own, per client too, so they cannot take a keyed client's
place (defect 4); request bodies are held against a budget (defect 8); a request whose client went
away is cancelled (defect 2: its decode stops)."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from service.api.admission import AUTHENTICATED, Admission, ticket
from service.api.error_handlers import WhileReading, error_response
from service.api.middleware import ABANDONED, BodyLimit, CancelOnDisconnect
from service.budget import BodyBudget
from service.core.errors import Overloaded
from service.runtime.model_host import Tally
from tests.polling import wait_until
from tests.service.api.test_event_loop import on_event_loop


class Held:
    """An app whose requests stay in flight until released, answering 200."""

    def __init__(self):
        self.release = asyncio.Event()
        self.entered = 0

    async def __call__(self, scope, receive, send):
        self.entered += 1
        await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


def _scope(client: str = "10.0.0.1", keyed: bool = True, length: int | None = None, chunked: bool = False) -> dict:
    headers = [(b"content-length", str(length).encode())] if length is not None else []
    headers += [(b"transfer-encoding", b"chunked")] if chunked else []
    return {"type": "http", "path": "/v1/vision/face/recognize", "headers": headers, "client": (client, 5000), AUTHENTICATED: keyed}


async def _call(app, scope, pieces: list[bytes] | None = None, stall: asyncio.Event | None = None) -> tuple[int, dict]:
    """Run one request to its answer: (status, JSON body). Every 503 must say when to retry. Its body
    arrives as `pieces`, then (with `stall`) nothing more until `stall` is set."""
    answer: dict = {}
    queue = list(pieces or [b""])

    async def receive():
        if not queue:
            if stall is None:
                return {"type": "http.disconnect"}
            await stall.wait()
            return {"type": "http.request", "body": b"", "more_body": False}
        return {"type": "http.request", "body": queue.pop(0), "more_body": bool(queue) or stall is not None}

    async def send(message):
        if message["type"] == "http.response.start":
            answer["status"] = message["status"]
            answer["headers"] = dict(message["headers"])
        elif message["type"] == "http.response.body":
            answer["body"] = json.loads(message["body"])

    await app(scope, receive, send)
    if answer["status"] == 503:
        assert answer["headers"].get(b"retry-after") == b"1", answer["headers"]
    return answer["status"], answer["body"]


def _admission(app, limit=2, unauthenticated=3, per_client=2, megabytes=100.0, wait=0.2) -> Admission:
    return Admission(app, limit, unauthenticated, per_client, BodyBudget(megabytes, wait))


def _with_bodies(app, max_body=25_000_000, min_rate=0, **admission) -> Admission:
    """Admission around the body limit around `app`, as create_app stacks them."""
    return _admission(BodyLimit(app, max_body, timeout=30.0, min_rate=min_rate), **admission)


async def _read_body(scope, receive, send) -> bool:
    """Read the whole body; False once a failure to read it is answered, as the app's handlers answer it."""
    try:
        while (await receive()).get("more_body"):
            pass
    except WhileReading as exc:
        await error_response(exc.error)(scope, receive, send)
        return False
    return True


class Reader(Held):
    """Reads its whole body, then stays in flight until released."""

    async def __call__(self, scope, receive, send):
        if await _read_body(scope, receive, send):
            await super().__call__(scope, receive, send)


MB = 1_000_000


def test_requests_whose_key_is_unknown_cannot_take_a_keyed_clients_place():
    """70 unauthenticated slow DeepStack uploads made every keyed request 503: they counted against
    the one admission limit before their key (a form field) was read."""

    async def scenario():
        held = Held()
        admission = _admission(held)
        anonymous = [asyncio.create_task(_call(admission, _scope(f"10.0.0.{i % 2}", keyed=False))) for i in range(4)]
        await asyncio.sleep(0.05)
        assert held.entered == 3  # the fourth is past FACEGATE_MAX_UNAUTHENTICATED_REQUESTS
        status, body = await anonymous[3]
        assert status == 503 and "FACEGATE_MAX_UNAUTHENTICATED_REQUESTS" in body["error"]["message"]
        per_client = await _call(admission, _scope("10.0.0.0", keyed=False))  # that client already has its 2
        assert per_client[0] == 503
        keyed = [asyncio.create_task(_call(admission, _scope("10.0.0.9"))) for _ in range(2)]
        await asyncio.sleep(0.05)
        assert held.entered == 5  # both keyed requests are in, beside three anonymous ones
        third = await _call(admission, _scope("10.0.0.9"))
        assert third[0] == 503 and "FACEGATE_MAX_INFLIGHT_REQUESTS" in third[1]["error"]["message"]
        held.release.set()
        assert [(await t)[0] for t in anonymous[:3] + keyed] == [200] * 5
        assert admission.inflight == 0 and not admission.waiting_for_key

    asyncio.run(scenario())


def test_a_request_whose_key_checks_out_moves_to_a_keyed_slot():
    async def scenario():
        moved = asyncio.Event()

        async def app(scope, receive, send):
            while (await receive()).get("more_body"):
                pass
            admitted = scope["facegate.admission"]
            try:
                await admitted.authenticated()
            except Overloaded:
                moved.set()
                raise
            moved.set()
            await asyncio.sleep(0.1)
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})

        admission = _with_bodies(app, limit=1)
        first = asyncio.create_task(_call(admission, _scope(keyed=False), [b"x" * 600, b"x" * 400]))
        await moved.wait()
        assert admission.inflight == 1 and not admission.waiting_for_key and admission.bodies.free == 100 * MB - 1000
        moved.clear()
        with pytest.raises(Overloaded):  # the keyed slot is taken: refused like any keyed request
            await _call(admission, _scope("10.0.0.2", keyed=False))
        assert (await first)[0] == 200 and admission.inflight == 0 and admission.bodies.free == 100 * MB

    asyncio.run(scenario())


def test_request_bodies_are_charged_to_their_budget_as_they_arrive():
    """32 × 24 MB base64 bodies added 1.44 GB: no budget counted them. Two 24 MB bodies of a 50 MB
    budget leave 2 MB: a third gets 2 MB in, then waits for room (unread), then 503."""

    async def scenario():
        held = Reader()
        admission = _with_bodies(held, limit=10, megabytes=50.0)
        first = [asyncio.create_task(_call(admission, _scope(), [b"x" * MB] * 24)) for _ in range(2)]
        await asyncio.sleep(0.1)
        assert held.entered == 2 and admission.bodies.free == 2 * MB
        status, body = await _call(admission, _scope(), [b"x" * MB] * 24)  # waits 0.2 s for room, then 503
        assert status == 503 and "FACEGATE_MAX_BODY_MEGABYTES" in body["error"]["message"]
        assert admission.bodies.free == 2 * MB  # what it had taken is given back
        small = asyncio.create_task(_call(admission, _scope(), [b"x" * MB]))
        await asyncio.sleep(0.05)
        assert held.entered == 3  # a body that fits goes in
        held.release.set()
        assert [(await t)[0] for t in [*first, small]] == [200] * 3
        assert admission.bodies.free == 50 * MB

    asyncio.run(scenario())


def test_bodies_that_all_wait_for_room_do_not_wait_for_each_other():
    """Charged on arrival, three 6 MB bodies at once in a 10 MB budget each held part and all waited
    for more: none could finish before FACEGATE_DECODE_WAIT. The newest gives way at once (its 2 MB
    back); the others are read, one after the other, and served."""

    async def scenario():
        held = Reader()
        admission = _with_bodies(held, limit=10, megabytes=10.0, wait=30.0)
        started = time.monotonic()
        # 4 + 4 + 2 MB arrive first and fill the budget; then each waits for its next piece (2, 2, 4 MB)
        pieces = [[b"x" * 4 * MB, b"x" * 2 * MB], [b"x" * 4 * MB, b"x" * 2 * MB], [b"x" * 2 * MB, b"x" * 4 * MB]]
        bodies = [asyncio.create_task(_call(admission, _scope(), body)) for body in pieces]
        done, _ = await asyncio.wait(bodies, timeout=5, return_when=asyncio.FIRST_COMPLETED)
        (refused,) = done
        status, body = refused.result()
        assert status == 503 and "gives way" in body["error"]["message"] and refused is bodies[2]  # the newest
        await asyncio.sleep(0.2)
        held.release.set()
        assert [(await t)[0] for t in bodies[:2]] == [200, 200] and time.monotonic() - started < 5
        assert admission.bodies.free == 10 * MB and not admission.holding and not admission.waiting

    asyncio.run(scenario())


def test_a_declared_length_holds_nothing_until_it_arrives():
    """Issue 45 (N2): 8 keyed uploads declaring 25 MB and trickling held the whole 200 MB budget by
    their Content-Length: a keyed /verify waited 60 s, then 503. Charged for what arrived, they hold
    their few bytes and the small body goes in at once."""

    async def scenario():
        held = Reader()
        admission = _with_bodies(held, limit=20, megabytes=200.0)
        stall = asyncio.Event()
        trickles = [asyncio.create_task(_call(admission, _scope(length=25 * MB), [b"x" * 10], stall)) for _ in range(8)]
        await asyncio.sleep(0.05)
        assert admission.bodies.free == 200 * MB - 80
        verify = asyncio.create_task(_call(admission, _scope(length=30_000), [b"x" * 30_000]))
        await asyncio.sleep(0.05)
        assert held.entered == 1 and admission.bodies.free == 200 * MB - 80 - 30_000
        held.release.set()
        assert (await verify)[0] == 200
        stall.set()
        await asyncio.gather(*trickles)
        assert admission.bodies.free == 200 * MB

    asyncio.run(scenario())


def test_a_trickling_body_is_ended_at_the_minimum_upload_rate(monkeypatch):
    """Issue 45 (N2): a body trickling 10 B/s held its slot for FACEGATE_BODY_TIMEOUT (60 s); below
    FACEGATE_BODY_MIN_RATE over a window it gets 408 at the window's end, while one above it arrives."""
    monkeypatch.setattr(BodyLimit, "RATE_WINDOW", 0.3)

    async def scenario():
        async def read(scope, receive, send):
            if not await _read_body(scope, receive, send):
                return
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})

        async def trickle(receive_piece: int, every: float, count: int):
            sent = 0

            async def receive():
                nonlocal sent
                await asyncio.sleep(every)
                sent += 1
                return {"type": "http.request", "body": b"x" * receive_piece, "more_body": sent < count}

            answer: dict = {}

            async def send(message):
                if message["type"] == "http.response.start":
                    answer["status"] = message["status"]
                elif message["type"] == "http.response.body":
                    answer["body"] = json.loads(message["body"])

            await _with_bodies(read, min_rate=10_000)(_scope(), receive, send)
            return answer

        slow, fast = await asyncio.gather(trickle(10, 0.05, 40), trickle(1000, 0.05, 40))  # 200 B/s and 20 KB/s for 2 s
        assert slow["status"] == 408 and "FACEGATE_BODY_MIN_RATE" in slow["body"]["error"]["message"]
        assert fast["status"] == 200

    asyncio.run(scenario())


def test_unauthenticated_bodies_stay_out_of_the_budget_until_their_key_checks_out():
    async def scenario():
        held = Reader()
        admission = _with_bodies(held, megabytes=10.0)
        waiting = asyncio.create_task(_call(admission, _scope(keyed=False), [b"x" * MB] * 9))
        await asyncio.sleep(0.05)
        assert held.entered == 1 and admission.bodies.free == 10 * MB and admission.inflight == 0
        held.release.set()
        await waiting

    asyncio.run(scenario())


def _receive_then(messages: list[dict], after: asyncio.Event):
    queue = list(messages)

    async def receive():
        if queue:
            return queue.pop(0)
        await after.wait()
        return {"type": "http.disconnect"}

    return receive


def test_a_request_whose_client_goes_away_is_cancelled():
    async def scenario():
        stopped = asyncio.Event()

        async def slow(scope, receive, send):
            await receive()  # the body
            try:
                await asyncio.sleep(60)  # an image decoding
            except asyncio.CancelledError:
                stopped.set()
                raise

        gone = asyncio.Event()
        scope = {"type": "http"}
        task = asyncio.create_task(CancelOnDisconnect(slow)(scope, _receive_then([{"type": "http.request", "body": b"x"}], gone), _sink))
        await asyncio.sleep(0.05)
        gone.set()
        await asyncio.wait_for(task, 5)  # returns: the cancellation was its own
        assert stopped.is_set() and scope[ABANDONED]

    asyncio.run(scenario())


def test_an_answered_request_is_not_cancelled_by_the_disconnect_after_it():
    async def scenario():
        async def quick(scope, receive, send):
            await receive()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})
            await asyncio.sleep(0.1)  # after the answer (a background task): runs to its end

        done = asyncio.Event()
        done.set()
        scope = {"type": "http"}
        await CancelOnDisconnect(quick)(scope, _receive_then([{"type": "http.request", "body": b""}], done), _sink)
        assert ABANDONED not in scope

    asyncio.run(scenario())


async def _sink(message):
    return None


def test_the_console_files_and_probes_take_no_slot():
    """Issue 45 (N5): 2,000 GETs of /console/js/main.js, 128 at once, took keyed slots: keyed /verify
    got 503 on 3 of 8 tries. With every slot held, the console's files and the probes still answer."""

    async def scenario():
        held = Held()
        admission = _admission(held, limit=1)
        busy = asyncio.create_task(_call(admission, _scope()))
        await asyncio.sleep(0.05)
        assert admission.inflight == 1 and (await _call(admission, _scope()))[0] == 503
        passed = []

        async def file(scope, receive, send):
            passed.append(scope["path"])
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})

        admission.app = file
        for path in ("/console/js/main.js", "/console/", "/healthz"):
            assert (await _call(admission, {**_scope(keyed=True), "path": path}))[0] == 200
        assert passed == ["/console/js/main.js", "/console/", "/healthz"] and admission.inflight == 1
        held.release.set()
        await busy

    asyncio.run(scenario())


def test_the_ticket_is_reachable_from_a_request():
    from starlette.requests import Request

    assert ticket(Request({"type": "http", "headers": []})) is None


class _HostTally:
    """The model host's Tally as one worker process reaches it (its answers at once)."""

    def __init__(self, tally: Tally):
        self.tally, self.mine = tally, Counter()

    def take(self, client: str, amount: int, cap: int) -> Future:
        answer: Future = Future()
        answer.set_result(self.tally.take(client, amount, cap, self.mine))
        return answer

    def give(self, client: str, amount: int) -> None:
        self.tally.give(client, amount, self.mine)


def test_requests_whose_key_is_unknown_are_counted_across_the_workers_of_a_host():
    """Issue 45 (N4): with 4 workers, 7 of 10 anonymous uploads from one address were admitted (4 a
    worker). With a model host, its tally counts them for every worker."""

    async def scenario():
        tally = Tally()
        held = Held()
        workers = [_admission(held, unauthenticated=3, per_client=2) for _ in range(2)]
        apps = [SimpleNamespace(state=SimpleNamespace(service=SimpleNamespace(hosted=_HostTally(tally)))) for _ in workers]

        def anonymous(worker: int, client: str):
            scope = {**_scope(client, keyed=False), "app": apps[worker]}
            return asyncio.create_task(_call(workers[worker], scope))

        first = [anonymous(0, "10.0.0.1"), anonymous(1, "10.0.0.1")]
        await asyncio.sleep(0.05)
        status, body = await anonymous(0, "10.0.0.1")  # its third, through either worker
        assert status == 503 and "FACEGATE_MAX_UNAUTHENTICATED_PER_CLIENT" in body["error"]["message"]
        first.append(anonymous(1, "10.0.0.2"))
        await asyncio.sleep(0.05)
        status, body = await anonymous(0, "10.0.0.3")  # the host's three are taken, one of them on the other worker
        assert status == 503 and "FACEGATE_MAX_UNAUTHENTICATED_REQUESTS" in body["error"]["message"]
        held.release.set()
        assert [(await t)[0] for t in first] == [200] * 3
        await asyncio.to_thread(wait_until, lambda: not tally.held, "every count given back (off the loop)")

    asyncio.run(scenario())


def test_a_host_slow_to_answer_leaves_admission_to_this_workers_counts_and_gets_its_late_grant_back():
    """The host's tally was asked on the event loop and awaited without bound: a host that did not
    answer held every anonymous request (a chaos run waited 10 s for a 503). Now it is asked off the
    loop and waited for TALLY_WAIT at most; then this worker's own counts decide, and what the host
    granted late is given back."""

    async def scenario():
        tally = Tally()
        host = _SilentTally(tally)
        app = SimpleNamespace(state=SimpleNamespace(service=SimpleNamespace(hosted=host)))
        admission = _admission(Held(), unauthenticated=3, per_client=1)
        admission.app.release.set()
        started = time.monotonic()
        status, _ = await asyncio.wait_for(_call(admission, {**_scope("10.0.0.1", keyed=False), "app": app}), 10)
        assert status == 200 and time.monotonic() - started < 5  # TALLY_WAIT (1 s), then admitted on its own counts
        host.answer_all()  # the host took it after all: given back
        await asyncio.to_thread(wait_until, lambda: not tally.held, "the late grant given back to the host")
        assert not any(host.on_loop), host.on_loop

    asyncio.run(scenario())


class _SilentTally(_HostTally):
    """A host's tally that answers only when `answer_all` is called; whether each call ran on the loop."""

    def __init__(self, tally: Tally):
        super().__init__(tally)
        self.waiting: list[tuple[Future, str, int, int]] = []
        self.on_loop: list[bool] = []

    def take(self, client: str, amount: int, cap: int) -> Future:
        self.on_loop.append(on_event_loop())
        self.waiting.append((Future(), client, amount, cap))
        return self.waiting[-1][0]

    def give(self, client: str, amount: int) -> None:
        self.on_loop.append(on_event_loop())
        super().give(client, amount)

    def answer_all(self) -> None:
        for future, client, amount, cap in self.waiting:
            future.set_result(self.tally.take(client, amount, cap, self.mine))
