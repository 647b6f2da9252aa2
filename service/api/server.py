"""The HTTP protocol `facegate serve` runs: uvicorn's h11 protocol (its header-size limit is
`FACEGATE_H11_MAX_INCOMPLETE_EVENT_SIZE`) plus a deadline for the request line and headers.

uvicorn times out idle keep-alive connections but not a client that opens a socket and sends
nothing, or trickles its headers a byte at a time: each such socket would be held forever. Here a
connection whose next request's headers are not complete within `FACEGATE_HEADER_TIMEOUT` seconds
(from the connection, or from the end of its previous response) is closed. The body has its own
deadline (`FACEGATE_BODY_TIMEOUT`, service.api.middleware.BodyLimit)."""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.h11_impl import H11Protocol

from service.settings import get_settings


class HeaderDeadlineProtocol(H11Protocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_header_deadline()

    def _arm_header_deadline(self) -> None:
        # A new request replaces self.cycle: the deadline fires on the cycle it was armed with.
        waiting_on = self.cycle
        self.loop.call_later(get_settings().header_timeout, self._header_deadline, waiting_on)

    def _header_deadline(self, waiting_on) -> None:
        if self.cycle is waiting_on and not self.transport.is_closing():
            self.transport.close()
