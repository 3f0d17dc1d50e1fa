"""A catalog URI to its storage: a local directory (the embedded default) or ``s3://bucket/prefix``.

Apart from both storages so that neither imports the other."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flash_pipeline.catalog.s3 import S3Storage
from flash_pipeline.catalog.storage import LocalStorage, Storage
from flash_pipeline.errors import FlashError


def open_storage(uri: str | Path, **options: Any) -> Storage:
    """``s3://bucket/prefix`` gives S3 storage (options: endpoint_url, region, ...); anything else a directory."""
    text = str(uri)
    if text.startswith("s3://"):
        return S3Storage(text, **options)
    if "://" in text and not text.startswith("file://"):
        raise FlashError(f"unsupported catalog URI {text!r}: use a local directory or s3://bucket/prefix")
    if text.startswith("file://"):
        text = text[len("file://") :]
    return LocalStorage(text)
