"""An S3 server for tests (moto's standalone server) and a fault-injecting HTTP proxy in front of it.

Python-level fail points (``pulsartx.storage.faults``) sit around pulsartx's own calls; they cannot
reach the requests delta-rs and object_store send, nor those libraries' own retries. The proxy
can: told to lose the answer of the next request matching a method and a path pattern, it forwards
that request to the server (so it takes effect there), then answers the client ``500`` or drops
the connection instead of passing the real answer on. Point a root's ``AWS_ENDPOINT_URL`` at
:attr:`FaultyProxy.url`.

Plain threads and ``http.client``: no dependency beyond moto's server, which ``make install``
installs with the test tools.
"""
from __future__ import annotations

import contextlib
import http.client
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

# Headers that describe one hop's connection, never forwarded.
_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"})
_LOST_BODY = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError</Code>'
              b"<Message>We encountered an internal error. Please try again.</Message></Error>")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_moto(port: int, timeout_s: float = 30.0) -> subprocess.Popen:
    """A moto S3 server on ``port``, once it answers. moto enforces conditional puts
    (``If-None-Match: *`` answers 412 on an existing key), which Delta commits on S3 rely on, and
    keeps data in memory only: started again on the same port, it is a store that lost everything."""
    server = subprocess.Popen([str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}", timeout=1)
            return server
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                raise
            time.sleep(0.1)


def stop(server: subprocess.Popen) -> None:
    server.terminate()
    try:
        server.wait(10)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(10)


@contextlib.contextmanager
def moto_server(timeout_s: float = 30.0) -> Iterator[str]:
    """A moto S3 server (:func:`start_moto`) on a free local port for the duration; yields its URL."""
    port = free_port()
    server = start_moto(port, timeout_s)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(server)


@dataclass
class Rule:
    """Lose the answer of the next ``times`` requests of ``method`` whose path matches ``path``."""

    method: str
    path: re.Pattern[str]
    how: str  # "500": answer 500 InternalError; "drop": close the connection without an answer
    times: int = 1


@dataclass(frozen=True)
class Exchange:
    """One request the proxy forwarded: what the server answered and what the client was told
    (``None``: the connection was dropped)."""

    method: str
    path: str
    headers: dict[str, str]
    status: int
    told: int | None
    at: float = 0.0  # time.monotonic() when the server answered


@dataclass
class FaultyProxy:
    """A forwarding HTTP/1.1 proxy to ``upstream`` (see the module). Every exchange is recorded in
    :attr:`exchanges`, in order."""

    upstream: str
    exchanges: list[Exchange] = field(default_factory=list)
    _rules: list[Rule] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        host, _, port = self.upstream.removeprefix("http://").rstrip("/").partition(":")
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as clients use S3

            def setup(self) -> None:
                super().setup()
                # An answer's headers and body go out in two writes: without this, Nagle's algorithm
                # and the client's delayed ACK add ~40 ms to every request.
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def log_message(self, *args: object) -> None:
                pass

            def _body(self) -> bytes | None:
                if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                    chunks = []
                    while size := int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16):
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                    while self.rfile.readline().strip():  # trailers
                        pass
                    return b"".join(chunks)
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else None

            def _forward(self) -> None:
                body = self._body()
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                conn = http.client.HTTPConnection(host, int(port or 80), timeout=30)
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    answer = conn.getresponse()
                    payload = answer.read()
                    status, reply_headers = answer.status, answer.getheaders()
                finally:
                    conn.close()
                rule = proxy._take(self.command, self.path.split("?", 1)[0])
                told = None if rule is not None and rule.how == "drop" else 500 if rule is not None else status
                with proxy._lock:
                    proxy.exchanges.append(Exchange(self.command, self.path, dict(self.headers.items()), status, told,
                                                    time.monotonic()))
                if told is None:
                    self.close_connection = True
                    with contextlib.suppress(OSError):
                        self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if rule is not None:
                    status, payload = 500, _LOST_BODY
                    reply_headers = [("Content-Type", "application/xml")]
                self.send_response(status)
                # A HEAD's answer has no body, but the length of the one a GET would get.
                keep_length = self.command == "HEAD"
                for k, v in reply_headers:
                    if k.lower() not in _HOP and k.lower() not in ("server", "date") and \
                            (keep_length or k.lower() != "content-length"):
                        self.send_header(k, v)
                if not keep_length:
                    self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="faulty-s3-proxy",
                                        daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def lose_answer(self, path: str, *, method: str = "PUT", how: str = "500", times: int = 1) -> None:
        """Forward the next ``times`` ``method`` requests whose path (without the query) matches the
        regex ``path``, then answer each with a 500 (``how="500"``) or drop the connection
        (``how="drop"``) instead of the server's answer."""
        if how not in ("500", "drop"):
            raise ValueError(f"how must be '500' or 'drop', not {how!r}")
        with self._lock:
            self._rules.append(Rule(method.upper(), re.compile(path), how, times))

    def armed(self) -> bool:
        """Whether a rule still waits for its request."""
        with self._lock:
            return bool(self._rules)

    def _take(self, method: str, path: str) -> Rule | None:
        with self._lock:
            for rule in self._rules:
                if rule.method == method and rule.path.search(path):
                    rule.times -= 1
                    if rule.times <= 0:
                        self._rules.remove(rule)
                    return rule
        return None

    def requests(self, method: str, path: str) -> list[Exchange]:
        """The exchanges of ``method`` whose path matches the regex ``path``, in order."""
        pattern = re.compile(path)
        with self._lock:
            return [e for e in self.exchanges if e.method == method and pattern.search(e.path.split("?", 1)[0])]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)
