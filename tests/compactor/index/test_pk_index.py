"""The primary key index files match the documented byte layout, and every pointer resolves.

Layout (flash_pipeline/compactor/pk_index.py): each row is a 20-byte SHA-1 digest, a 4-byte big-endian
compacted file number, an 8-byte big-endian row index, then the sort key bytes (per key: a flag byte, 0 for
null and 1 for a value, then the value in order-preserving big-endian form, inverted for "descending").
The digest is SHA-1 over the framed key (flash_pipeline/compactor/kernels/digest.py): per primary key column in name
order, a null is b"\\x00"; a value is b"\\x01" + its byte length (4 bytes, big-endian) + its bytes (UTF-8 for
strings, 8-byte big-endian two's complement for integers). Everything here is recomputed by hand.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from compaction_helpers import DeltaLog, fresh_lake, oracle, read_compacted, rows_of, run_compact

TABLE = "ACME.INDEXED.V1"
PART = {"day": "d1"}
PART_T = (("day", "d1"),)
SCHEMA = pa.schema([("name", pa.string()), ("id", pa.int64()), ("ver", pa.int64()), ("seq", pa.int64()), ("payload", pa.string())])
PKS = ["name", "id"]  # recorded (and framed) in name order: id, name
KEY_SCHEMA = pa.schema([SCHEMA.field(k) for k in PKS])
SORT_KEYS = [("ver", "descending"), ("seq", "ascending")]
SORT_WIDTH = 2 * (1 + 8)
N_BUCKETS = 3


def frame_key(row: dict[str, Any], primary_keys: list[str]) -> bytes:
    out = b""
    for name in sorted(primary_keys):
        v = row[name]
        if v is None:
            out += b"\x00"
        elif isinstance(v, str):
            data = v.encode("utf-8")
            out += b"\x01" + len(data).to_bytes(4, "big") + data
        elif isinstance(v, int):
            out += b"\x01" + (8).to_bytes(4, "big") + v.to_bytes(8, "big", signed=True)
        else:  # pragma: no cover - this test only uses strings and integers
            raise TypeError(v)
    return out


def sort_bytes(row: dict[str, Any]) -> bytes:
    out = b""
    for name, direction in SORT_KEYS:
        v = row[name]
        if v is None:
            out += b"\x00" + b"\x00" * 8
            continue
        value = (v + (1 << 63)).to_bytes(8, "big")  # flip the sign bit: unsigned order == signed order
        if direction == "descending":
            value = bytes(255 - b for b in value)
        out += b"\x01" + value
    return out


def _build(cat: Any) -> DeltaLog:
    log = DeltaLog(cat, TABLE, PART, SCHEMA)
    names = ["ab", "a", "", "null", None, "c", "bc"]

    def rows(start: int, n: int, ver_of: Any) -> pa.Table:
        recs = [
            {"name": names[i % len(names)], "id": (i % 3) - 1 if i % 5 else None, "ver": ver_of(i), "seq": i, "payload": f"p{i}"}
            for i in range(start, start + n)
        ]
        return pa.Table.from_pylist(recs, schema=SCHEMA)

    log.append("upsert", [rows(0, 9, lambda i: i % 4), rows(9, 7, lambda i: None if i % 3 == 0 else 2)])
    log.append("delete", [pa.Table.from_pylist([{"name": "ab", "id": 0}, {"name": None, "id": None}], schema=KEY_SCHEMA)])
    log.append("upsert", [rows(16, 12, lambda i: 1)])
    return log


def _compact(cat: Any) -> None:
    run_compact(cat, TABLE, PKS, SORT_KEYS, hash_bucket_count=N_BUCKETS, rows_per_compacted_file=4, rows_per_primary_key_index_file=3)


@pytest.fixture(scope="module")
def indexed_lake() -> Any:
    """Two compaction runs (the second over a prior index and carried files) of one small stream."""
    with fresh_lake() as cat:
        log = _build(cat)
        _compact(cat)
        log.append("upsert", [pa.Table.from_pylist([{"name": "c", "id": 1, "ver": -5, "seq": 99, "payload": "late"}], schema=SCHEMA)])
        log.append("delete", [pa.Table.from_pylist([{"name": "a", "id": 0}], schema=KEY_SCHEMA)])
        _compact(cat)
        yield cat, log


def test_compacted_rows_match_oracle(indexed_lake: Any) -> None:
    cat, log = indexed_lake
    want = rows_of(oracle(log.log_table(), PKS, SORT_KEYS, SCHEMA.names), SCHEMA.names)
    assert rows_of(read_compacted(cat, TABLE, PART), SCHEMA.names) == want


def test_one_index_row_parsed_by_hand_points_at_its_row(indexed_lake: Any) -> None:
    cat, _ = indexed_lake
    cv = cat.latest_compacted(TABLE, PART_T)
    assert cv.index.sort_key_width == SORT_WIDTH
    width = 28 + cv.index.sort_key_width
    bucket, ix = next((b, files[0]) for b, files in enumerate(cv.index.buckets) if files)
    raw = cat.storage.read(ix.key)
    assert len(raw) == ix.bytes == ix.rows * width

    row = raw[:width]
    digest = row[:20]
    file_number = int.from_bytes(row[20:24], "big") + ix.file_shift  # see docs/catalog-layout.md
    row_index = int.from_bytes(row[24:28], "big")
    sort = row[28:]
    assert int.from_bytes(digest, "big") % N_BUCKETS == bucket

    (data_file,) = [f for f in cv.files if f.file_number == file_number]
    target = cat.read_file(data_file).slice(row_index, 1).to_pylist()[0]
    assert hashlib.sha1(frame_key(target, PKS)).digest() == digest
    assert sort == sort_bytes(target)


def _parse_all(cat: Any, cv: Any) -> list[tuple[int, bytes, int, int, bytes]]:
    dtype = np.dtype([("digest", "S20"), ("file", ">u4"), ("row", ">u4"), ("sort", f"V{cv.index.sort_key_width}")])
    out = []
    for b, files in enumerate(cv.index.buckets):
        for ix in files:
            arr = np.frombuffer(cat.storage.read(ix.key), dtype=dtype)
            assert len(arr) == ix.rows
            for r in arr:  # a carried index file's stored file numbers move by its recorded file_shift
                out.append((b, bytes(r["digest"]).ljust(20, b"\x00"), int(r["file"]) + ix.file_shift, int(r["row"]), bytes(r["sort"])))
    return out


def test_every_index_row_resolves_and_lies_in_its_bucket(indexed_lake: Any) -> None:
    cat, _ = indexed_lake
    cv = cat.latest_compacted(TABLE, PART_T)
    files = {f.file_number: cat.read_file(f).to_pylist() for f in cv.files}
    entries = _parse_all(cat, cv)
    assert len(entries) == cv.index.rows == cv.rows == sum(len(r) for r in files.values())
    pointers = set()
    digests = set()
    for bucket, digest, file_number, row_index, sort in entries:
        assert int.from_bytes(digest, "big") % cv.index.hash_bucket_count == bucket
        target = files[file_number][row_index]
        assert hashlib.sha1(frame_key(target, PKS)).digest() == digest
        assert sort == sort_bytes(target)
        pointers.add((file_number, row_index))
        digests.add(digest)
    # a bijection: every compacted row has exactly one index row, every key exactly one row
    assert pointers == {(n, i) for n, rows in files.items() for i in range(len(rows))}
    assert len(digests) == len(entries)
    assert all(f.rows <= 3 for fs in cv.index.buckets for f in fs)
