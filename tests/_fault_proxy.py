"""A fault-injecting HTTP/1.1 proxy on 127.0.0.1 in front of the moto S3 server, for the S3 fault tests.

boto3 talks to ``proxy.endpoint``; the proxy parses each request (Content-Length or chunked body, keep-alive
connections, ``Expect: 100-continue``), forwards it to moto on a fresh upstream connection, reads moto's whole
response and relays it with an explicit Content-Length. Every request is logged in arrival order
(``proxy.log``), so a test can dry-run an operation to learn how many requests it makes and which.

Faults, each deterministic:

- random faults (``rate``, ``conditional_rate``, seeded): 503/500 answers or dropped connections, before or
  after forwarding (the store applied the request but the client never hears so);
- :meth:`FaultProxy.lose_response`: forward ONE chosen request (by log index, or the ``offset``-th request
  from the first one matching a method and path pattern), read moto's full response, then close the client
  connection without sending it;
- :meth:`FaultProxy.refuse_for`: an endpoint outage of N seconds, now or right after the response to the first
  request matching a pattern: ``how="refuse"`` closes the listening socket (new connections are refused by the
  kernel) and reopens it on the same port afterwards; ``how="close"`` accepts and immediately closes each new
  connection (counted in ``closed_on_accept``). Either way a request arriving on an already open keep-alive
  connection during the outage gets its connection closed, unforwarded.

Not a fault: ``latency`` seconds added to every forwarded request (an object store's round trip; moto answers
in about a millisecond), and ``max_in_flight``, the most requests forwarded at once, so a test can see whether
a client overlaps its requests.
"""

from __future__ import annotations

import http.client
import random
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlparse

ERROR_BODIES = {
    503: b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>',
    500: b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InternalError</Code><Message>We encountered an internal error.</Message></Error>',
}
ACTIONS = ("error_before", "drop_before", "error_after", "drop_after")
_HOP_BY_HOP = ("transfer-encoding", "connection", "content-length", "keep-alive")


def _matches(method: str | None, path: str | None, entry: dict[str, Any]) -> bool:
    return (method is None or entry["method"] == method) and (path is None or re.search(path, entry["path"]) is not None)


class _Handler(BaseHTTPRequestHandler):
    """One client connection; ``self.server`` is the FaultProxy."""

    protocol_version = "HTTP/1.1"
    server: "FaultProxy"

    def log_message(self, *args: Any) -> None:
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _handle(self) -> None:
        proxy = self.server
        body = self._body()
        entry, action = proxy._admit(self.command, self.path, self.headers.get("If-None-Match") == "*")
        if action in ("refused", "drop_before"):
            self.close_connection = True
            return
        if action == "error_before":
            self._reply(503, [("Content-Type", "application/xml")], ERROR_BODIES[503])
            return
        status, headers, data = proxy.forward(self.command, self.path, self.headers, body)
        entry["status"] = status
        if action in ("drop_after", "lose"):
            self.close_connection = True  # the store applied it; the client never hears so
            return
        if action == "error_after":
            self._reply(500, [("Content-Type", "application/xml")], ERROR_BODIES[500])
            return
        self._reply(status, headers, data)
        proxy._answered(entry)

    def _reply(self, status: int, headers: list[tuple[str, str]], data: bytes) -> None:
        self.send_response_only(status)
        for name, value in headers:
            if name.lower() not in _HOP_BY_HOP:
                self.send_header(name, value)
        if self.command == "HEAD":
            length = dict((k.lower(), v) for k, v in headers).get("content-length", "0")
            self.send_header("Content-Length", length)
        else:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        self.wfile.flush()

    do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = _handle


class FaultProxy:
    """Threaded HTTP forwarder with request log and injectable faults (see the module docstring)."""

    def __init__(self, upstream: str, seed: int = 0, rate: float = 0.0, conditional_rate: float = 0.0, latency: float = 0.0) -> None:
        url = urlparse(upstream)
        self.upstream = (url.hostname, url.port)
        self.rng = random.Random(seed)
        self.rate = rate
        self.conditional_rate = conditional_rate
        self.latency = latency
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        self.log: list[dict[str, Any]] = []
        self.lost: list[dict[str, Any]] = []
        self.connections = 0  # connections accepted
        self.closed_on_accept = 0  # of those, closed at once by a how="close" outage
        self.outages: list[tuple[float, float]] = []  # (start, end) on time.monotonic()
        self._lose: dict[str, Any] | None = None
        self._outage_trigger: dict[str, Any] | None = None
        self._refuse_until = 0.0
        self._refuse_how = "refuse"
        self._stop = threading.Event()
        self._open: set[socket.socket] = set()
        self._listener: socket.socket | None = self._bind(0)
        self.port = self._listener.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._accept_loop, name="fault-proxy", daemon=True)

    # ----- fault controls -------------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget the log and any armed fault (between the runs of one test)."""
        with self.lock:
            self.log.clear()
            self.lost.clear()
            self._lose = None
            self._outage_trigger = None
            self.max_in_flight = self.in_flight

    def lose_response(self, index: int | None = None, method: str | None = None, path: str | None = None, offset: int = 0) -> None:
        """Lose, once, the response to request number ``index`` of the log, or to the ``offset``-th request
        (0: itself) counted from the first request whose method and path (a regex) match."""
        with self.lock:
            self._lose = {"index": index, "method": method, "path": path, "offset": offset, "start": None}

    def refuse_for(self, seconds: float, method: str | None = None, path: str | None = None, how: str = "refuse") -> None:
        """An outage of ``seconds``: now, or right after answering the first request matching method and path."""
        assert how in ("refuse", "close")
        with self.lock:
            if method is None and path is None:
                self._start_outage(seconds, how)
            else:
                self._outage_trigger = {"seconds": seconds, "how": how, "method": method, "path": path}

    def requests(self, method: str | None = None, path: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            return [e for e in self.log if _matches(method, path, e)]

    @property
    def refusing(self) -> bool:
        return time.monotonic() < self._refuse_until

    # ----- internals ------------------------------------------------------------------------------------
    def _start_outage(self, seconds: float, how: str) -> None:
        now = time.monotonic()
        self._refuse_how = how
        self._refuse_until = now + seconds
        self.outages.append((now, now + seconds))

    def _admit(self, method: str, path: str, conditional: bool) -> tuple[dict[str, Any], str]:
        """Log a request and decide its fate."""
        with self.lock:
            entry = {"index": len(self.log), "method": method, "path": path, "conditional": conditional,
                     "action": "forward", "status": None, "time": time.monotonic()}
            self.log.append(entry)
            if self.refusing:
                entry["action"] = "refused"
                return entry, "refused"
            lose = self._lose
            if lose is not None:
                if lose["index"] is not None:
                    fire = entry["index"] == lose["index"]
                else:
                    if lose["start"] is None and _matches(lose["method"], lose["path"], entry):
                        lose["start"] = entry["index"]
                    fire = lose["start"] is not None and entry["index"] == lose["start"] + lose["offset"]
                if fire:
                    self._lose = None
                    entry["action"] = "lose"
                    self.lost.append(entry)
                    return entry, "lose"
            draw, pick = self.rng.random(), self.rng.randrange(len(ACTIONS))
        rate = self.conditional_rate if conditional else self.rate
        if draw < rate:
            # faults that hit a conditional create mostly strike after the put reached the store
            action = ("error_after", "drop_after", "drop_after", "error_before")[pick] if conditional else ACTIONS[pick]
            entry["action"] = action
            return entry, action
        return entry, "forward"

    def _answered(self, entry: dict[str, Any]) -> None:
        with self.lock:
            trigger = self._outage_trigger
            if trigger is not None and _matches(trigger["method"], trigger["path"], entry):
                self._outage_trigger = None
                self._start_outage(trigger["seconds"], trigger["how"])

    def forward(self, method: str, path: str, headers: Any, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        with self.lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.latency:
                time.sleep(self.latency)
            return self._forward(method, path, headers, body)
        finally:
            with self.lock:
                self.in_flight -= 1

    def _forward(self, method: str, path: str, headers: Any, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for name, value in headers.items():
                if name.lower() in _HOP_BY_HOP or name.lower() == "expect":
                    continue
                conn.putheader(name, value)
            conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, resp.getheaders(), data
        finally:
            conn.close()

    def _bind(self, port: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(64)
        sock.settimeout(0.1)
        return sock

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            if self.refusing and self._refuse_how == "refuse":
                if self._listener is not None:
                    self._listener.close()  # the kernel now refuses connections to this port
                    self._listener = None
                time.sleep(0.02)
                continue
            if self._listener is None:
                self._listener = self._bind(self.port)
            try:
                conn, addr = self._listener.accept()
            except (socket.timeout, BlockingIOError):
                continue
            except OSError:
                continue
            with self.lock:
                self.connections += 1
                refuse = self.refusing
                if refuse:
                    self.closed_on_accept += 1
            if refuse:
                conn.close()
                continue
            conn.settimeout(None)
            threading.Thread(target=self._serve, args=(conn, addr), daemon=True).start()

    def _serve(self, conn: socket.socket, addr: Any) -> None:
        with self.lock:
            self._open.add(conn)
        try:
            _Handler(conn, addr, self)  # type: ignore[arg-type]
        except (OSError, ValueError):
            pass  # the client went away, or stop() shut the socket
        finally:
            with self.lock:
                self._open.discard(conn)
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()

    def __enter__(self) -> "FaultProxy":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        if self._listener is not None:
            self._listener.close()
        with self.lock:
            open_conns = list(self._open)
        for conn in open_conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
