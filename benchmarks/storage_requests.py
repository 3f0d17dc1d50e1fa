"""Counting a lake's storage requests (benchmarks and tests): every method of the local storage that touches the
disk, and every S3 call (``S3Storage._call``, which every request goes through), counted on the way to the real
thing. Nothing is faked: the counted calls run as they would."""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from typing import Any, Iterator

from flash_pipeline.catalog.s3 import S3Storage
from flash_pipeline.catalog.storage import LocalStorage

LOCAL_METHODS = ("read", "read_range", "read_range_into", "list", "list_children", "exists", "create", "write", "write_data",
                 "delete", "upload", "size", "arrow_source")


@contextmanager
def count_requests() -> Iterator[Counter]:
    """Within the block, a Counter of storage requests by name (local methods; S3 operations such as
    ``list_objects_v2``), for every catalog of the process."""
    calls: Counter = Counter()
    saved: dict[tuple[type, str], Any] = {}

    def counted(cls: type, name: str) -> Any:
        original = cls.__dict__[name]

        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            if cls is S3Storage:
                calls[getattr(args[0], "__name__", "s3")] += 1
            else:
                calls[name] += 1
            return original(self, *args, **kwargs)

        saved[(cls, name)] = original
        return wrapper

    for name in LOCAL_METHODS:
        if name in LocalStorage.__dict__:
            setattr(LocalStorage, name, counted(LocalStorage, name))
    setattr(S3Storage, "_call", counted(S3Storage, "_call"))
    try:
        yield calls
    finally:
        for (cls, name), original in saved.items():
            setattr(cls, name, original)
