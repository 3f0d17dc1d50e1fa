"""Counting a lake's storage requests in tests and benchmarks (no test functions here)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from flash_pipeline.catalog.catalog import Catalog


def count_requests(catalog: Catalog) -> Counter:
    """Storage requests by kind, counted on the storage's real methods (S3: the boto3 client's calls)."""
    calls: Counter = Counter()
    storage = catalog.storage
    client = getattr(storage, "client", None)
    if client is not None:
        client.meta.events.register("before-call.s3.*", lambda model, **_: calls.update([model.name]))
        return calls
    for name in ("read", "list_children", "list", "exists", "create", "write"):
        original = getattr(storage, name)

        def counted(*args: Any, _name: str = name, _original: Any = original, **kwargs: Any) -> Any:
            calls[_name] += 1
            return _original(*args, **kwargs)

        setattr(storage, name, counted)
    return calls
