"""One storage interface for the lake: a local directory (the embedded default) or ``s3://bucket/prefix``.

Keys are ``/``-separated paths relative to the lake root. The only primitive the catalog needs for safe
concurrent commits is :meth:`Storage.create`: an atomic, exclusive create (hard link of a fully written temp
file locally, ``If-None-Match: *`` on S3). Everything a reader can see is written whole before it is linked
or put, so a crash leaves at worst an unreferenced orphan, never a half-visible object.
"""

from __future__ import annotations

import builtins
import os
import shutil
import tempfile
import time
import uuid
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

import pyarrow as pa

from flash_pipeline.errors import FlashError, NotFound
from flash_pipeline.settings import env_number, env_switch

T = TypeVar("T")
R = TypeVar("R")


class Storage(ABC):
    """Byte-level access to the lake."""

    uri: str
    # how many small files a round reads concurrently (steps/source_io.read_units): an object store answers
    # each GET after a network round trip, which threads overlap; FLASH_READ_AHEAD overrides it (read_ahead_setting)
    read_ahead: int = 8
    # whether asking for one key is cheaper than listing its folder: a stat on a local disk takes microseconds
    # whatever the folder holds, where a listing reads the whole folder; on an object store each question is a
    # round trip and one listing answers many (the change feed's readers and writers choose by it)
    probes_are_cheap: bool = False

    @abstractmethod
    def read(self, key: str) -> bytes:
        """Whole object; raises NotFound."""

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        """``length`` bytes from ``offset`` (fewer at the end); raises NotFound. Lets a reader stream a large
        object in chunks (the index writer) instead of holding it whole."""
        return self.read(key)[offset : offset + length]

    def read_range_into(self, key: str, offset: int, out: memoryview) -> int:
        """Fill ``out`` with the bytes from ``offset`` (fewer at the end); returns how many. A reader streaming a
        large object in chunks reuses one buffer instead of allocating each chunk anew (every new page costs a
        fault: a 9 MiB index chunk took 4-6 ms to read into a new allocation, ~1 ms into a reused buffer)."""
        data = self.read_range(key, offset, len(out))
        out[: len(data)] = data
        return len(data)

    @abstractmethod
    def write(self, key: str, data: bytes | memoryview) -> None:
        """Atomic overwrite: readers see the old bytes or the new bytes (``data``: any bytes-like buffer)."""

    def write_data(self, key: str, data: bytes | memoryview) -> None:
        """:meth:`write` for the bulk files of an attempt (index files, round state): on a local lake they are
        not fsynced one by one, exactly like compacted data files (see :class:`LocalStorage`)."""
        self.write(key, data)

    @abstractmethod
    def create(self, key: str, data: bytes) -> bool:
        """Atomic exclusive create. False if the key already holds other bytes.

        Returns True when the key already holds exactly ``data`` (a retried create whose first attempt
        succeeded), so callers put a unique token in ``data``.
        """

    @abstractmethod
    def list(self, prefix: str) -> list[str]:
        """All keys under ``prefix`` (recursive), sorted."""

    @abstractmethod
    def list_children(self, prefix: str, starting_with: str = "", start_after: str = "") -> builtins.list[str]:
        """Names of the immediate children (objects or folders) of ``prefix``, sorted; only those whose name
        starts with ``starting_with`` when given (on S3 the listing itself is narrowed: one request however
        many other children there are), and only those after ``start_after`` (S3's ``StartAfter``: a reader of
        the change feed lists what follows its position, not what precedes it)."""

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def delete(self, key: str) -> None:
        """Delete one key; a missing key is not an error."""

    @abstractmethod
    def upload(self, local_path: str | Path, key: str) -> int:
        """Copy a local file in; returns its size in bytes."""

    @abstractmethod
    def arrow_source(self, key: str) -> Any:
        """Something PyArrow readers accept (a path or a buffer) for ``key``."""

    def write_arrow(self, key: str, writer: Any) -> int:
        """Run ``writer(sink)`` into a buffer and store it; returns bytes written."""
        sink = pa.BufferOutputStream()
        writer(sink)
        data = sink.getvalue().to_pybytes()
        self.write(key, data)
        return len(data)

    def delete_prefix(self, prefix: str) -> int:
        keys = self.list(prefix)
        for key in keys:
            self.delete(key)
        return len(keys)

    def size(self, key: str) -> int:
        return len(self.read(key))

    # writes go through temporary files beside their key (a local directory; an object store's put is whole)
    writes_temp_files = False

    def remove_stale_temp_files(self, prefix: str, idle_seconds: float, dry_run: bool = False) -> builtins.list[str]:
        """Delete the temporary files of writes in the folder ``prefix`` that nothing has touched for ``idle_seconds``
        (writers that died before renaming them into place); returns their keys. An object store has none: a put
        is whole or absent."""
        return []


class LocalStorage(Storage):
    """A directory on this machine."""

    probes_are_cheap = True
    writes_temp_files = True

    def __init__(self, root: str | Path) -> None:
        # a local small file is read in ~0.03 ms, and every release of the GIL around it costs its thread a
        # wait for the GIL back (up to the 5 ms switch interval while a step digests): read-ahead threads made
        # s4's hash bucket slower, 1.26-1.53 s in process against 0.80-0.83 s reading one file after another
        # (0.83-0.86 s against 0.56-0.62 s on a warm Ray). A network file system is another matter: set
        # FLASH_READ_AHEAD there.
        self.read_ahead = read_ahead_setting(0)
        self.root = Path(root).expanduser().resolve()
        self.uri = str(self.root)
        self._root_text = str(self.root)
        self._root_prefix = self._root_text.rstrip(os.sep) + os.sep
        # a lake root (or a folder above it) that is a file would fail later, mid-command, with a traceback
        fsync_every_file()  # a bad FLASH_FSYNC stops here, before anything is written
        blocker = next((p for p in (self.root, *self.root.parents) if p.exists() and not p.is_dir()), None)
        if blocker is not None:
            raise FlashError(
                f"catalog {self.root} cannot be a lake: {blocker} is a file, not a directory; "
                "use a directory (an existing lake or a new path) as the catalog"
            )

    def _path_text(self, key: str) -> str:
        # normpath, not resolve(): ".." is what lets a key escape, and resolving symlinks cost a system call
        # per path component of every file a round opens (a third of reading thousands of small deltas)
        path = os.path.normpath(os.path.join(self._root_text, key))
        if path != self._root_text and not path.startswith(self._root_prefix):
            raise FlashError(f"key {key!r} escapes the lake root {self.root}")
        return path

    def _path(self, key: str) -> Path:
        return Path(self._path_text(key))

    def read(self, key: str) -> bytes:
        # a plain open of the path text: a pathlib.Path per read was ~10 us, 0.03 s of listing 3,000 deltas
        try:
            with open(self._path_text(key), "rb") as fh:
                return fh.read()
        except (FileNotFoundError, NotADirectoryError):
            raise NotFound(f"{key} not found in lake {self.uri}") from None

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        try:
            with open(self._path_text(key), "rb") as fh:
                fh.seek(offset)
                return fh.read(length)
        except (FileNotFoundError, NotADirectoryError):
            raise NotFound(f"{key} not found in lake {self.uri}") from None

    def read_range_into(self, key: str, offset: int, out: memoryview) -> int:
        try:
            fd = os.open(self._path_text(key), os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            raise NotFound(f"{key} not found in lake {self.uri}") from None
        try:
            got = 0
            while got < len(out):  # preadv may return fewer bytes than asked before the end of the file
                n = os.preadv(fd, [out[got:]], offset + got)
                if n == 0:
                    break
                got += n
            return got
        finally:
            os.close(fd)

    def _temp_beside(self, path: Path, data: bytes | memoryview, durable: bool = True) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".tmp-{uuid.uuid4().hex}"
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            if durable or fsync_every_file():
                os.fsync(fh.fileno())
        return tmp

    def write_data(self, key: str, data: bytes | memoryview) -> None:
        path = self._path(key)
        os.replace(self._temp_beside(path, data, durable=False), path)

    def write(self, key: str, data: bytes | memoryview) -> None:
        path = self._path(key)
        tmp = self._temp_beside(path, data)
        os.replace(tmp, path)

    def create(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        tmp = self._temp_beside(path, data)
        try:
            os.link(tmp, path)
            created = True
        except FileExistsError:
            created = path.read_bytes() == data
        finally:
            tmp.unlink(missing_ok=True)
        return created

    def list(self, prefix: str) -> list[str]:
        base = self._path(prefix) if prefix else self.root
        if not base.exists():
            return []
        if base.is_file():
            return [prefix]
        out = []
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                if name.startswith(".tmp-"):
                    continue
                out.append(os.path.relpath(os.path.join(dirpath, name), self.root).replace(os.sep, "/"))
        return sorted(out)

    def list_children(self, prefix: str, starting_with: str = "", start_after: str = "") -> builtins.list[str]:
        try:
            names = os.listdir(self._path_text(prefix) if prefix else self._root_text)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(n for n in names if n.startswith(starting_with) and n > start_after and not n.startswith(".tmp-"))

    def exists(self, key: str) -> bool:
        return self._path(key).exists()

    def delete(self, key: str) -> None:
        path = self._path(key)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)

    def delete_prefix(self, prefix: str) -> int:
        n = len(self.list(prefix))
        self.delete(prefix)
        return n

    def remove_stale_temp_files(self, prefix: str, idle_seconds: float, dry_run: bool = False) -> builtins.list[str]:
        """``.tmp-`` files directly in the folder ``prefix`` (a write in progress: written whole, then renamed into
        place) not modified for ``idle_seconds``: a live writer's temporary file is modified as it is written and
        renamed right after, so one idle that long belongs to a writer that died. Never a committed file: those
        have their names. One listing of one folder (not a walk: retention asks for a few folders a partition)."""
        base = self._path_text(prefix) if prefix else self._root_text
        cutoff = time.time() - idle_seconds
        out = []
        try:
            names = [n for n in os.listdir(base) if n.startswith(".tmp-")]
        except (FileNotFoundError, NotADirectoryError):
            return []
        for name in names:
            path = os.path.join(base, name)
            try:
                if os.stat(path).st_mtime > cutoff:
                    continue
                if not dry_run:
                    os.unlink(path)
            except FileNotFoundError:  # renamed into place or removed meanwhile
                continue
            out.append(f"{prefix}/{name}" if prefix else name)
        return sorted(out)

    def upload(self, local_path: str | Path, key: str) -> int:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".tmp-{uuid.uuid4().hex}"
        shutil.copyfile(local_path, tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        return path.stat().st_size

    def arrow_source(self, key: str) -> Any:
        path = self._path(key)
        if not path.exists():
            raise NotFound(f"{key} not found in lake {self.uri}")
        return str(path)

    def write_arrow(self, key: str, writer: Any) -> int:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".tmp-{uuid.uuid4().hex}"
        with pa.OSFile(str(tmp), "wb") as sink:
            writer(sink)
        if fsync_every_file():
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
        return path.stat().st_size

    def size(self, key: str) -> int:
        return self._path(key).stat().st_size


def fsync_every_file() -> bool:
    """FLASH_FSYNC=1: fsync every compacted data, index and round-state file of a local lake before it is
    renamed into place. Off by default: a local lake fsyncs its commit points (manifests, the Delta log, round
    completion), which is what a process crash (kill -9, OOM) needs, as tested; the bulk files of a version
    become durable by the OS's writeback, as the peers' outputs (PyArrow, DuckDB, Polars, Spark on a local
    file system) do. Only a power loss in the seconds after a commit can tell the difference; an S3 lake is
    durable on every put either way. Fsyncing the index alone (as before) cost s1 about 0.3 s and bought
    nothing, since the data files beside it were never fsynced."""
    return env_switch("FLASH_FSYNC", False, "commit points only")


def read_ahead_setting(default: int) -> int:
    """FLASH_READ_AHEAD=N: read up to N small files ahead on threads in each task (0: one after another), in
    place of the storage's default (0 on a local directory, 8 on S3); also how many partitions a job plans at
    once, and how many delta manifests or partition records it reads at once (``overlapped``). For a lake directory
    on a network file system (NFS, EFS), where every open is a round trip. Read when the lake is opened, so a bad
    value stops a command before anything is written."""
    return int(env_number("FLASH_READ_AHEAD", default, 0, 64, "a whole number of files from 0 to 64",
                          "0 on a local lake, 8 on S3", whole=True))


def overlapped(storage: "Storage", fn: Callable[[T], R], items: Sequence[T], name: str = "flash-read") -> list[R]:
    """``[fn(x) for x in items]``, with up to ``storage.read_ahead`` calls at a time on threads when the storage
    overlaps round trips (an object store answers each request after one; a local disk does not, and threads
    would only contend for the GIL). Results in order; the first failure in order is raised."""
    if storage.read_ahead > 1 and len(items) > 1:
        with ThreadPoolExecutor(max_workers=min(storage.read_ahead, len(items)), thread_name_prefix=name) as pool:
            return list(pool.map(fn, items))
    return [fn(x) for x in items]


def temp_dir() -> str:
    return tempfile.mkdtemp(prefix="flash-")
