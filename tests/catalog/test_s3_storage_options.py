"""S3Storage's retry options arrive as keywords (catalog/s3.py): a misspelt one is refused by name, as a Python
signature would, instead of being dropped silently."""

from __future__ import annotations

import pytest

from flash_pipeline.catalog.s3 import S3_OPTIONS, S3Storage
from flash_pipeline.errors import FlashError


def test_an_unknown_s3_option_is_refused_naming_it_and_the_valid_ones() -> None:
    with pytest.raises(TypeError, match="max_attemps") as raised:
        S3Storage("s3://bucket/prefix", endpoint_url="http://127.0.0.1:9", max_attemps=3)
    for name in S3_OPTIONS:
        assert name in str(raised.value)


def test_known_s3_options_are_resolved_and_checked() -> None:
    storage = S3Storage("s3://bucket/prefix", endpoint_url="http://127.0.0.1:9", max_attempts=2, read_timeout=7)
    assert storage.max_attempts == 2 and storage.options["read_timeout"] == 7.0
    with pytest.raises(FlashError, match="max_attempts"):
        S3Storage("s3://bucket/prefix", endpoint_url="http://127.0.0.1:9", max_attempts=0)
