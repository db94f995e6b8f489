"""The /metrics server's connection handling (migd/metrics/aserver.py), over real sockets: keep-alive,
pipelining, the connection cap, idle and oversized clients, and flow control towards a client that
does not read."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from migd.metrics.aserver import MetricsServer, _Connection

BODY = b"# a made-up exposition\n" + b"x" * 100_000 + b"\n"


class _Exposition:
    def parts(self) -> tuple[bytes, bytes]:
        return BODY, b""


class _Sampler:
    @property
    def last_success(self) -> float:  # always fresh: read when /healthz asks, not when this module loaded
        return time.time()

    def stop(self) -> None:
        pass


@pytest.fixture
def server() -> Iterator[MetricsServer]:
    s = MetricsServer("127.0.0.1", 0, _Exposition(), _Sampler(), stale_after_s=60)  # type: ignore[arg-type]
    t = threading.Thread(target=s.serve_forever, daemon=True)
    t.start()
    yield s
    s.stop()
    t.join(5)


def _connect(server: MetricsServer) -> socket.socket:
    return socket.create_connection(server.server_address[:2], timeout=5)


def _responses(sock: socket.socket, n: int) -> list[tuple[bytes, bytes]]:
    """Read ``n`` responses (head, body) off ``sock``."""
    data, out = b"", []
    while len(out) < n:
        end = data.find(b"\r\n\r\n")
        if end >= 0:
            head = data[:end]
            length = int(next(h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")))
            if len(data) >= end + 4 + length:
                out.append((head, data[end + 4:end + 4 + length]))
                data = data[end + 4 + length:]
                continue
        chunk = sock.recv(1 << 16)
        assert chunk, f"closed after {len(out)} of {n} responses"
        data += chunk
    return out


def _closed(sock: socket.socket, within_s: float) -> bool:
    sock.settimeout(within_s)
    try:
        while sock.recv(1 << 16):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


GET = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"


def test_keep_alive_and_pipelined_requests_are_answered_in_order(server: MetricsServer) -> None:
    with _connect(server) as s:
        s.sendall(GET)
        (head, body), = _responses(s, 1)
        assert head.startswith(b"HTTP/1.1 200") and body == BODY and b"Connection: close" not in head
        s.sendall(GET + b"GET /healthz HTTP/1.1\r\n\r\n" + b"GET /nope HTTP/1.1\r\nConnection: close\r\n\r\n")
        got = _responses(s, 3)
        assert [h.split(b"\r\n")[0] for h, _ in got] == [b"HTTP/1.1 200 OK", b"HTTP/1.1 200 OK",
                                                         b"HTTP/1.1 404 Not Found"]
        assert got[1][1] == b"ok\n" and b"Connection: close" in got[2][0]
        assert _closed(s, 5)


def test_http10_bad_request_and_body_close_the_connection(server: MetricsServer) -> None:
    for request, status in ((b"GET /metrics HTTP/1.0\r\n\r\n", b"200"), (b"nonsense\r\n\r\n", b"400"),
                            (b"POST /metrics HTTP/1.1\r\nContent-Length: 1\r\n\r\nx", b"405")):
        with _connect(server) as s:
            s.sendall(request)
            (head, _), = _responses(s, 1)
            assert head.split(b" ")[1] == status and b"Connection: close" in head
            assert _closed(s, 5), request


def test_requests_sent_before_a_half_close_are_all_answered(server: MetricsServer) -> None:
    """``printf 'GET ...GET ...' | nc -N``: the client closes its side after sending; asyncio's default closed
    the connection at once, and only the first of three answers came."""
    with _connect(server) as s:
        s.sendall(GET + b"GET /healthz HTTP/1.1\r\n\r\n" + b"GET /nope HTTP/1.1\r\n\r\n")
        s.shutdown(socket.SHUT_WR)
        got = _responses(s, 3)
        assert [h.split(b" ")[1] for h, _ in got] == [b"200", b"200", b"404"]
        assert _closed(s, 5)


@pytest.mark.parametrize("request_,status", [
    (b"\r\nGET /healthz HTTP/1.1\r\n\r\n", b"200"),  # RFC 9112 2.2: a leading empty line is ignored
    (b"\nGET /healthz HTTP/1.1\nHost: x\n\n", b"200"),  # 2.2: a bare LF may end a line (none was answered)
    (b"GET /healthz HTTP/1.9\r\n\r\n", b"505"),  # (HTTP/1.x was taken for any x)
    (b"GET /healthz HTTP/1.\r\n\r\n", b"505"),
    (b"GET /healthz HTTP/1.1\r\nX: " + b"y" * 70_000 + b"\r\n\r\n", b"431"),  # (in one read it was answered)
], ids=["leading empty line", "bare LF", "HTTP/1.9", "HTTP/1.", "head over the bound"])
def test_a_request_line_is_read_as_rfc_9112_says(server: MetricsServer, request_: bytes, status: bytes) -> None:
    with _connect(server) as s:
        s.sendall(request_)
        (head, _), = _responses(s, 1)
        assert head.split(b" ")[1] == status, head
        if status != b"200":
            assert b"Connection: close" in head and _closed(s, 5)


def test_a_chunked_body_is_never_read_as_a_request(server: MetricsServer) -> None:
    """``Transfer-Encoding: chunked`` on a GET kept the connection, and its body ``0\\r\\n\\r\\n`` was answered 400."""
    with _connect(server) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
        (head, body), = _responses(s, 1)
        assert head.startswith(b"HTTP/1.1 200") and b"Connection: close" in head and body == b"ok\n"
        assert _closed(s, 5)


def test_at_the_cap_a_new_connection_takes_the_place_of_the_longest_idle(server: MetricsServer) -> None:
    """The cap bounds descriptors, but never locks a scrape out: the connection idle longest makes room."""
    server.max_connections = 2
    held = [_connect(server), _connect(server)]
    try:
        deadline = time.monotonic() + 5
        while len(server.connections) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        held[1].sendall(GET)  # held[1] is active; held[0] has asked nothing since it connected
        assert _responses(held[1], 1)[0][1] == BODY
        with _connect(server) as new:
            new.sendall(GET)
            assert _responses(new, 1)[0][1] == BODY
            assert _closed(held[0], 5)
            assert server.refused == 1
            held[1].sendall(GET)  # the active one is still served
            assert _responses(held[1], 1)[0][1] == BODY
    finally:
        for s in held:
            s.close()


@pytest.mark.integration
def test_a_slow_drip_on_every_slot_does_not_lock_out_a_scrape(server: MetricsServer) -> None:
    """70 connections each sending a header byte now and then held all 64 slots: scrapes were reset.
    Bytes are no sign of life, only complete requests are; a new connection takes a dripper's place."""
    server.idle_timeout_s = 2.0
    drips = [_connect(server) for _ in range(server.max_connections + 6)]
    try:
        stop = time.monotonic() + 3
        while time.monotonic() < stop:  # one byte per connection every 0.3 s: faster than the idle timeout
            for d in drips:
                try:
                    d.send(b"X")
                except OSError:
                    pass
            with _connect(server) as scrape:
                scrape.sendall(GET)
                assert _responses(scrape, 1)[0][1] == BODY
            time.sleep(0.3)
        deadline = time.monotonic() + 5  # and the drippers are dropped by the idle timeout
        while any(not _closed(d, 0.01) for d in drips) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(_closed(d, 0.01) for d in drips)
    finally:
        for d in drips:
            d.close()


def test_idle_and_oversized_clients_are_dropped(server: MetricsServer) -> None:
    server.idle_timeout_s = 0.4
    with _connect(server) as silent, _connect(server) as half:
        half.sendall(b"GET /metrics HTTP/1.1\r\n")  # a head that never ends
        t0 = time.monotonic()
        assert _closed(silent, 5) and _closed(half, 5)
        assert 0.3 < time.monotonic() - t0 < 3
    with _connect(server) as big:
        big.sendall(b"GET /metrics HTTP/1.1\r\nX: " + b"y" * (server.max_header_bytes + 10))
        assert _closed(big, 5)
    deadline = time.monotonic() + 5
    while server.connections and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not server.connections


def _buffered(server: MetricsServer) -> int:
    return sum(c.transport.get_write_buffer_size() for c in list(server.connections))


def test_a_client_that_does_not_read_is_not_read_from(server: MetricsServer) -> None:
    """2,000 pipelined scrapes (200 MB of answers) from a client that reads nothing: once the kernel's
    buffers are full the server stops reading requests, so it holds about one response, not 2,000."""
    with _connect(server) as s:
        s.sendall(GET * 2000)
        deadline = time.monotonic() + 5
        while _buffered(server) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        assert 0 < _buffered(server) < 3 * len(BODY)
        assert len(_responses(s, 3)) == 3  # reading again lets the rest through


def test_a_client_that_stops_reading_is_dropped_after_the_idle_timeout(server: MetricsServer) -> None:
    server.idle_timeout_s = 0.4
    with _connect(server) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(GET * 50)
        time.sleep(0.2)
        assert _buffered(server) > 0  # waiting on the client
        deadline = time.monotonic() + 5
        while server.connections and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not server.connections


class _Transport:
    """Records what a connection writes, in the order of all connections' writes."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    def write(self, data: bytes) -> None:
        self.log.append(self.name)

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def test_pipelined_requests_on_one_connection_do_not_starve_another() -> None:
    """One connection's pipelined /healthz flood was answered in one turn; scrapes on the others waited
    seconds.  Now one request per turn of the loop: a scrape that arrives behind 2,000 pipelined requests
    is the second answer, not the 2,001st (deterministic: the loop is stepped here, not timed)."""
    server = MetricsServer("127.0.0.1", 0, _Exposition(), _Sampler(), stale_after_s=60)  # type: ignore[arg-type]
    try:
        order: list[str] = []
        flood, scrape = _Connection(server), _Connection(server)
        flood.connection_made(_Transport("flood", order))
        scrape.connection_made(_Transport("scrape", order))
        flood.data_received(b"GET /healthz HTTP/1.1\r\n\r\n" * 2000)
        scrape.data_received(GET)
        server._loop.run_until_complete(asyncio.sleep(0.5))
        assert len(order) == 2001 and order.index("scrape") <= 1, order[:5]
    finally:
        server._server.close()
        server._loop.close()
