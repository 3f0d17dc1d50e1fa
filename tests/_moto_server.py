"""Run ``moto.server`` with requests serialized, so conditional puts are atomic as on real S3.

moto implements ``PutObject`` with ``If-None-Match: *`` as "look up the key, then store" without a lock; two
concurrent puts of the same key can in principle both pass the look-up in its threaded server. Real S3 makes
the check and the write one atomic step, which is what the catalog relies on. Wrapping moto's WSGI app in one
lock gives the tests that guarantee; everything else is ``python -m moto.server`` unchanged.

Usage: python tests/_moto_server.py -H 127.0.0.1 -p PORT
"""

from __future__ import annotations

import sys
import threading

from moto import server
from moto.moto_server.werkzeug_app import DomainDispatcherApplication

_lock = threading.Lock()
_call = DomainDispatcherApplication.__call__


def _serialized(self, environ, start_response):  # type: ignore[no-untyped-def]
    with _lock:
        result = _call(self, environ, start_response)
        # materialize the body inside the lock: some responses are computed while being iterated
        try:
            return [b"".join(result)]
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()


DomainDispatcherApplication.__call__ = _serialized  # type: ignore[method-assign]

if __name__ == "__main__":
    server.main(sys.argv[1:])
