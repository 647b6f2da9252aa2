"""The load generator counts what the server answered, request by request: statuses as sent,
keep-alive connections reused, a connection the server closes reopened, a chunked answer read to its
end, and a refused connection counted as status 0 — against a small HTTP/1.1 server of the standard library."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from benchmarks.loadgen import multipart_request, offer, route_requests
from benchmarks.loadtest import free_port


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    connections = 0  # one handler a connection
    lock = threading.Lock()

    def setup(self) -> None:
        super().setup()
        with self.lock:
            Handler.connections += 1

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        status = 503 if b"busy" in body else 200
        close = b"close" in body
        if b"chunked" in body:
            self.send_response(status)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.write(b"5\r\nhello\r\n0\r\n\r\n")
            return
        self.send_response(status)
        self.send_header("Content-Length", "2")
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(b"{}")


@pytest.fixture
def server():
    Handler.connections = 0
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_statuses_are_counted_as_answered_over_reused_connections(server):
    requests = [multipart_request(server, "/x", {"image": b"ok"}), multipart_request(server, "/x", {"image": b"busy"})]
    result = offer(server, "/x", requests, concurrency=4, total=200, processes=2)
    assert result.statuses == {200: 100, 503: 100} and result.processes == 2 and result.concurrency == 4
    assert Handler.connections == 4  # one keep-alive connection per client, never reopened
    assert result.rps > 0 and 0 < result.p50 <= result.p95 <= result.p99


def test_a_closed_connection_is_reopened_and_a_chunked_answer_read_whole(server):
    requests = [multipart_request(server, "/x", {"image": b"close"}), multipart_request(server, "/x", {"image": b"chunked"})]
    result = offer(server, "/x", requests, concurrency=1, total=10, processes=1)
    assert result.statuses == {200: 10}
    assert Handler.connections == 6  # the first, and after each of the 5 closes a new one for the next request


def test_a_refused_connection_is_status_0_and_time_bounds_a_run():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens
    result = offer(url, "/healthz", route_requests(url, "/healthz", []), concurrency=2, seconds=0.3, processes=1)
    assert set(result.statuses) == {0} and result.statuses[0] > 0


def test_a_verify_request_carries_two_images_and_identify_one():
    verify = route_requests("http://h:1", "/verify", [b"AAAA", b"BBBB"])
    identify = route_requests("http://h:1", "/identify", [b"AAAA"])
    assert len(verify) == 2 and b'name="image1"' in verify[0] and b'name="image2"' in verify[0] and b"BBBB" in verify[0]
    assert b'name="image"' in identify[0] and identify[0].startswith(b"POST /identify HTTP/1.1\r\nHost: h:1\r\n")
    head, body = identify[0].split(b"\r\n\r\n", 1)
    assert f"Content-Length: {len(body)}".encode() in head
