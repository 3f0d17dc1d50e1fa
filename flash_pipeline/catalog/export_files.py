"""Writing an export: the compacted files' rows in their recorded schema as exact Parquet files, a directory
swapped into place whole (never a half export), and the checks of the target directory."""

from __future__ import annotations

import errno
import os
import re
import shutil
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from flash_pipeline.catalog.files import ContentType, read_table, write_table
from flash_pipeline.catalog.model import CompactedVersion
from flash_pipeline.catalog.storage import LocalStorage, Storage
from flash_pipeline.catalog.validation import INTERNAL_COLUMNS, columns_match
from flash_pipeline.errors import FlashError


def read_compacted_bytes(data: bytes, content_type: ContentType, compacted: CompactedVersion) -> pa.Table:
    """One compacted file from its bytes, every column in the version's recorded type (a format may store one
    widened: files.read_table casts it back)."""
    schema = compacted.pa_schema() if compacted.arrow_schema else None
    return read_table(pa.BufferReader(data), content_type, None, schema, compacted=True)


def stored_schema(data: bytes, content_type: ContentType) -> pa.Schema | None:
    """The types a file gives back read without a recorded schema (None for CSV, which has no types)."""
    source = pa.BufferReader(data)
    if content_type is ContentType.PARQUET:
        import pyarrow.parquet as pq

        return pq.read_schema(source)
    if content_type is ContentType.FEATHER:
        with pa.ipc.open_file(source) as reader:
            return reader.schema
    if content_type is ContentType.ORC:
        import pyarrow.orc as paorc

        return paorc.ORCFile(source).schema
    return None


def conform_exported(table: pa.Table, schema: pa.Schema, source: str) -> pa.Table:
    """``table`` in ``schema``'s columns: missing ones null, changed types cast safely (refused if lossy)."""
    columns = []
    present = set(table.column_names)
    for field in schema:
        if field.name not in present:
            if not field.nullable:
                raise FlashError(f"the new schema's column {field.name!r} is not nullable and the compacted rows lack "
                                 "it: make it nullable")
            columns.append(pa.nulls(table.num_rows, field.type))
            continue
        column = table.column(field.name)
        if column.type != field.type:
            try:
                column = column.cast(field.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise FlashError(
                    f"cannot cast column {field.name!r} of {source} from {column.type} to {field.type} ({reason}): "
                    "choose a new type the compacted values fit"
                ) from None
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=schema)


def local_root(storage: Storage) -> Path | None:
    """The directory of a local lake (None for other stores): what an export destination must stay out of."""
    return storage.root if isinstance(storage, LocalStorage) else None


def require_local_dir(raw: str | Path, what: str = "export") -> None:
    """Refuse a URI given as DIR (``s3://b/p``, which a Path reads as the relative folder ``s3:/b/p``): DIR is local.
    Checked on the text as given (``./backup:/2026`` is a folder)."""
    if isinstance(raw, str) and re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", raw):
        raise FlashError(f"{what} destination {raw} is a URI: --out writes a local directory; give one, then copy "
                         "it to the object store (e.g. aws s3 sync DIR s3://...)")


def check_export_dir(out: Path, overwrite: bool, what: str = "export", lake_root: Path | None = None) -> None:
    """Refuse an export (or ``read --out``: ``what``) destination that is a file, a non-empty directory without
    ``overwrite``, or one that overlaps the local lake at ``lake_root``: the lake itself, a folder inside it, or a
    folder holding it (``--overwrite`` would replace the lake's own files with the export)."""
    if lake_root is not None:
        target, lake = out.resolve(), lake_root.resolve()
        if target == lake or lake in target.parents or target in lake.parents:
            where = ("is the lake" if target == lake else
                     "lies inside the lake" if lake in target.parents else "holds the lake")
            raise FlashError(f"{what} destination {out} {where} ({lake}): give --out a directory outside the lake")
    blocker = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise FlashError(f"{what} destination {out} cannot be a directory: {blocker} is a file; give --out a new or "
                         "empty directory")
    if out.is_dir() and not overwrite and any(out.iterdir()):
        raise FlashError(
            f"{what} destination {out} is not empty: give --out a new or empty directory, or pass --overwrite "
            "(overwrite=True) to replace its contents"
        )


def swap_into_place(tmp: Path, out: Path, overwrite: bool) -> None:
    """Rename the finished export ``tmp`` to ``out``; with ``overwrite`` the old contents go as a whole."""
    target = out.resolve() if out.is_symlink() else out
    try:
        os.rename(tmp, target)  # atomic when ``out`` is missing or an empty directory
        return
    except OSError as exc:
        if not (overwrite and target.is_dir()) or exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            if target.is_dir() and exc.errno in (errno.ENOTEMPTY, errno.EEXIST):  # filled by someone meanwhile
                raise FlashError(f"export destination {out} is not empty: pass --overwrite (overwrite=True) to replace "
                                 "it") from None
            raise
    if _exchange(tmp, target):  # DIR holds the old export or the new one at every instant, crash or not
        shutil.rmtree(tmp, ignore_errors=True)  # now the old export (a crash here leaves it hidden, as documented)
        return
    old = target.parent / f".{target.name}.replaced-{uuid.uuid4().hex[:12]}"
    os.rename(target, old)
    try:
        os.rename(tmp, target)
    except BaseException:
        os.rename(old, target)  # put the previous export back
        raise
    shutil.rmtree(old, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directories in one step (Linux ``renameat2(RENAME_EXCHANGE)``, glibc 2.28+); False where the
    system or file system cannot, for the two renames of the fallback. Python's os module has no renameat2."""
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EXDEV):
        return False
    raise OSError(err, os.strerror(err), str(b))


def recorded_user_schema(compacted: CompactedVersion, stored: pa.Schema) -> pa.Schema:
    """The user columns of ``compacted`` with the types its manifest records (``stored``'s when it records none)."""
    if not compacted.arrow_schema:
        return stored
    return pa.schema([f for f in compacted.pa_schema() if f.name not in INTERNAL_COLUMNS])


def write_exact(table: pa.Table, folder: Path, name: str) -> Path:
    """``table`` as a Parquet file in ``folder``, or as Feather (Arrow's own types) when Parquet would give a
    column back in another type (timestamp[s], date64, dictionaries, durations...): an appended file's
    recorded schema is what it reads back as."""

    path = folder / f"{name}.parquet"
    pq_write(table, path)
    if columns_match(pq.read_schema(path), table.schema):
        return path
    path.unlink()
    path = folder / f"{name}{ContentType.FEATHER.extension}"
    with pa.OSFile(str(path), "wb") as sink:
        write_table(table, sink, ContentType.FEATHER)
    return path


def pq_write(table: pa.Table, path: Path) -> None:
    with pa.OSFile(str(path), "wb") as sink:
        write_table(table, sink, ContentType.PARQUET)
