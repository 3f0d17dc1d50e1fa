"""A bucket's new survivors as primary key index rows, the index writer's last part (pk_index.py
``stream_next_bucket_rows``): read from the envelopes hash bucket made, and written over them when the writer owns
them."""

from __future__ import annotations

from typing import Any

import numpy as np

from flash_pipeline.compactor.kernels.index_kernels import merged_index_rows_kernel
from flash_pipeline.compactor.kernels.layout import Layout, index_pointers, survivor_index_rows
from flash_pipeline.compactor.model.survivors import MaskedSurvivors


def raw_envelopes(dtype: np.dtype, width: int) -> bool:
    """Are rows of ``dtype`` in the envelope layout the one-pass survivor kernel reads (hash_bucket.envelope_dtype:
    digest at byte 0, little-endian int64 rank at 20, sort key bytes at 28)?"""
    fields: Any = dtype.fields or {}
    return (dtype.itemsize == 28 + width and fields.get("digest", (None, -1))[1] == 0
            and fields.get("rank", (None, -1)) == (np.dtype("<i8"), 20)
            and (not width or fields.get("sort", (None, -1))[1] == 28))


def survivor_rows(layout: Layout, bucket: int, survivors: np.ndarray | MaskedSurvivors, width: int,
                   raw_out: np.ndarray) -> None:
    """The new survivors' index rows into ``raw_out`` (raw index rows), in rank order."""
    if isinstance(survivors, MaskedSurvivors) and not all(raw_envelopes(p.dtype, width) for p in survivors.parts):
        survivors = survivors.envelopes()
    if isinstance(survivors, MaskedSurvivors):
        at = 0
        for part, keep in survivors.split():  # read where hash bucket put them; a source lies in one part
            at += survivor_index_rows(layout, bucket, part, width, raw_out[at:], keep)
    elif len(survivors):
        if raw_envelopes(survivors.dtype, width):
            survivor_index_rows(layout, bucket, survivors, width, raw_out)
        else:
            files, rows = index_pointers(layout, bucket, survivors["rank"])
            env = np.ascontiguousarray(survivors).view(np.uint8).reshape(len(survivors), survivors.dtype.itemsize)
            no_prior = np.zeros((0, raw_out.shape[1]), dtype=np.uint8)
            merged_index_rows_kernel(no_prior, np.zeros(0, dtype=np.int64), env,
                                     np.arange(len(survivors), dtype=np.int64), files, rows, width, raw_out)


def reusable_envelopes(survivors: np.ndarray | MaskedSurvivors, dtype: np.dtype) -> np.ndarray | None:
    """The survivors' envelopes as index rows, in place, when the writer may overwrite them (the parts are its
    alone: one array, writable, its rows laid out as index rows are, byte for byte the same size). Index row j
    is written after envelope j and every envelope before it was read (j counts the survivors before it), so the
    survivors' rows become the array's first rows with no second array: s1's two buckets wrote 190 MB of index
    rows beside 225 MB of envelopes at the round's peak."""
    if not isinstance(survivors, MaskedSurvivors) or not survivors.reusable or len(survivors.parts) != 1:
        return None
    part = survivors.parts[0]
    width = dtype.itemsize - 28
    if (not raw_envelopes(part.dtype, width) or part.dtype.itemsize != dtype.itemsize
            or not part.flags.writeable or not part.flags.c_contiguous):
        return None
    return part.view(dtype)
