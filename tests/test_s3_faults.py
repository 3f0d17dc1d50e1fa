"""Transient S3 faults between the client and the endpoint never lose or half-register a delta.

A small threaded HTTP proxy on 127.0.0.1 sits between boto3 and the moto server. On a deterministic, seeded
schedule it answers some requests itself with 503 SlowDown or 500 InternalError, or closes the connection
without a response, either before forwarding the request or AFTER forwarding it (the write reached the store
but the client never hears so). Conditional creates of delta manifests get a higher fault rate, so a retried
``If-None-Match`` put that finds its own first attempt committed (412) is exercised.
"""

from __future__ import annotations

import http.client
import random
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator
from urllib.parse import urlparse

import pyarrow as pa
import pytest

from flash_pipeline.catalog.catalog import Catalog
from flash_pipeline.catalog.s3 import S3Storage

from conftest import BUCKET

ERROR_BODIES = {
    503: b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>',
    500: b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InternalError</Code><Message>We encountered an internal error.</Message></Error>',
}
ACTIONS = ("error_before", "drop_before", "error_after", "drop_after")


class FaultProxy:
    def __init__(self, upstream: str, seed: int, rate: float, conditional_rate: float) -> None:
        url = urlparse(upstream)
        self.upstream = (url.hostname, url.port)
        self.rng = random.Random(seed)
        self.rate = rate
        self.conditional_rate = conditional_rate
        self.lock = threading.Lock()
        self.log: list[dict[str, Any]] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return b"".join(chunks)
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _handle(self) -> None:
                body = self._body()
                conditional = self.command == "PUT" and self.headers.get("If-None-Match") == "*"
                action = proxy.decide(conditional)
                entry = {"method": self.command, "path": self.path, "conditional": conditional, "action": action, "status": None}
                with proxy.lock:
                    proxy.log.append(entry)
                if action == "drop_before":
                    self.close_connection = True
                    return
                if action == "error_before":
                    self._reply_error(503)
                    return
                status, headers, data = proxy.forward(self.command, self.path, self.headers, body)
                entry["status"] = status
                if action == "drop_after":
                    self.close_connection = True
                    return
                if action == "error_after":
                    self._reply_error(500)
                    return
                self.send_response_only(status)
                for name, value in headers:
                    if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(name, value)
                if self.command == "HEAD":
                    self.send_header("Content-Length", dict((k.lower(), v) for k, v in headers).get("content-length", "0"))
                else:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def _reply_error(self, status: int) -> None:
                data = ERROR_BODIES[status]
                self.send_response_only(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def decide(self, conditional: bool) -> str:
        with self.lock:
            draw, pick = self.rng.random(), self.rng.randrange(len(ACTIONS))
        rate = self.conditional_rate if conditional else self.rate
        if draw >= rate:
            return "forward"
        if conditional:
            # faults that hit a conditional create mostly strike after the put reached the store
            return ("error_after", "drop_after", "drop_after", "error_before")[pick]
        return ACTIONS[pick]

    def forward(self, method: str, path: str, headers: Any, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(*self.upstream, timeout=30)
        try:
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for name, value in headers.items():
                if name.lower() in ("transfer-encoding", "content-length", "connection"):
                    continue
                conn.putheader(name, value)
            conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, resp.getheaders(), data
        finally:
            conn.close()

    def __enter__(self) -> "FaultProxy":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def faulty(moto_endpoint: str) -> Iterator[tuple[FaultProxy, str]]:
    with FaultProxy(moto_endpoint, seed=20240611, rate=0.1, conditional_rate=0.5) as proxy:
        yield proxy, f"s3://{BUCKET}/faults-{uuid.uuid4().hex[:10]}"


def check_lake(catalog: Catalog, table: str, part: tuple, n_deltas: int, expected: set[tuple[int, int]]) -> None:
    deltas = catalog.deltas(table, part)
    assert [d.position for d in deltas] == list(range(1, n_deltas + 1))
    assert len({d.commit_id for d in deltas}) == len(deltas)
    seen = []
    for d in deltas:
        for f in d.files:
            assert catalog.storage.size(f.key) == f.bytes  # every file of a visible delta is whole
            seen.extend((r["writer"], r["seq"]) for r in catalog.read_file(f).to_pylist())
    assert sorted(seen) == sorted(expected)
    referenced = {f.key for d in deltas for f in d.files}
    assert {k for k in catalog.listing() if "/files/" in k} == referenced


def one_row(writer: int, seq: int) -> pa.Table:
    return pa.table({"writer": pa.array([writer], pa.int64()), "seq": pa.array([seq], pa.int64())})


def test_appends_survive_injected_faults(faulty: tuple[FaultProxy, str], moto_endpoint: str) -> None:
    proxy, uri = faulty
    catalog = Catalog(uri, endpoint_url=proxy.endpoint)
    part = (("Order Day", "1995-04-03"),)
    n = 6
    for seq in range(n):
        delta = catalog.append("ACME.FAULTS.V1", part, "upsert", [one_row(0, seq), one_row(1, seq)])
        assert delta.position == seq + 1

    # faults were really injected, of every kind, including a lost answer to a manifest create
    actions = {e["action"] for e in proxy.log}
    assert set(ACTIONS) <= actions, actions
    manifests = [e for e in proxy.log if e["conditional"] and "/deltas/" in e["path"]]
    lost = [e for e in manifests if e["action"] in ("drop_after", "error_after") and e["status"] == 200]
    assert lost, "no manifest create lost its answer after reaching the store"
    assert any(e["status"] == 412 for e in manifests), "no retried create found its own manifest (412)"
    print(f"{len(proxy.log)} requests, {sum(e['action'] != 'forward' for e in proxy.log)} faults")

    # an independent client straight to moto sees every delta whole, at distinct positions, nothing extra
    direct = Catalog(uri, endpoint_url=moto_endpoint)
    check_lake(direct, "ACME.FAULTS.V1", part, n, {(w, s) for w in (0, 1) for s in range(n)})


def test_concurrent_appends_survive_injected_faults(faulty: tuple[FaultProxy, str], moto_endpoint: str) -> None:
    proxy, uri = faulty
    part = (("Order Day", "1995-04-04"),)
    writers, per_writer = 3, 4
    catalogs = [Catalog(S3Storage(uri, endpoint_url=proxy.endpoint)) for _ in range(writers)]
    errors: list[BaseException] = []

    def run(w: int) -> None:
        try:
            for seq in range(per_writer):
                catalogs[w].append("ACME.FAULTS.V1", part, "upsert", [one_row(w, seq)])
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert not errors, errors
    assert sum(e["action"] != "forward" for e in proxy.log) > 0
    check_lake(Catalog(uri, endpoint_url=moto_endpoint), "ACME.FAULTS.V1", part, writers * per_writer, {(w, s) for w in range(writers) for s in range(per_writer)})
