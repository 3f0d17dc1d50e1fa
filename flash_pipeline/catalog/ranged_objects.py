"""A large object-store object as a random-access file for PyArrow: each read is a ranged GET of what it asks.

Why: a Parquet reader reads a file's footer and then only the column chunks it decodes; handed the whole object
as one buffer (an S3 ``arrow_source`` did that), it downloaded every byte first and held them all: a hash bucket
task that decodes three key columns of a 500 MB delta fetched 500 MB, each unit of a file split by row groups
fetched the file again, and a unit's memory bound (source_io.UNIT_ROWS) did not bound the object's bytes.

An object is opened with one GET of its last WHOLE_OBJECT_BYTES (``Range: bytes=-N``): a smaller object comes
back whole, as with a plain GET, and is read from memory; a larger one comes back with its footer and its size
(``Content-Range``), and every read before that tail is a ranged GET through the storage's retried calls. The
reader asks for column chunks (coalesced when it pre-buffers) or for bounded pieces of them (source_io's
streamed row groups), so what a task holds is what it decodes.
"""

from __future__ import annotations

import io
from typing import Callable

# objects up to this size are read whole in the opening GET; larger ones are read by ranges, their last bytes
# (the Parquet footer, ~2-60 KiB) kept from that GET. (Source files of at most source_io.SMALL_UNIT_BYTES are read
# whole anyway; a larger last piece only fetched the last row group's chunks again when a reader opened the file
# twice, as hash bucket and materialize do: 8 MiB cost s1's 36 MB deltas 16 MB more each)
WHOLE_OBJECT_BYTES = 1 << 20


class RangedObject(io.RawIOBase):
    """A read-only, seekable file over an object of ``size`` bytes whose last bytes are ``tail``; ``read_range``
    (offset, length) fetches any other bytes. Wrap it in ``pyarrow.PythonFile`` for PyArrow's readers."""

    def __init__(self, read_range: Callable[[int, int], bytes], size: int, tail: bytes) -> None:
        super().__init__()
        self._read_range = read_range
        self._size = size
        self._tail = tail
        self._tail_start = size - len(tail)
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._position = base + offset
        return self._position

    def size(self) -> int:
        return self._size

    def read(self, size: int | None = -1) -> bytes:
        start = self._position
        end = self._size if size is None or size < 0 else min(self._size, start + size)
        if end <= start:
            return b""
        if start >= self._tail_start:
            data = self._tail[start - self._tail_start : end - self._tail_start]
        elif end <= self._tail_start:
            data = self._read_range(start, end - start)
        else:
            data = self._read_range(start, self._tail_start - start) + self._tail[: end - self._tail_start]
        if len(data) != end - start:
            raise OSError(f"object changed while read: asked bytes {start}-{end - 1} of {self._size}, "
                          f"got {len(data)}")
        self._position = end
        return data

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)
