"""S3 storage through boto3: ``s3://bucket/prefix``.

Transient errors (throttling, 5xx, dropped connections, timeouts) are retried by botocore's standard retry
mode with exponential backoff. Conditional creates use ``If-None-Match: *``; if a retried create finds the key
already holding exactly our bytes, the first attempt had succeeded and the create counts as ours (every commit
document carries a unique commit id, so equal bytes mean the same writer).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from flash_pipeline.catalog.storage import Storage
from flash_pipeline.errors import FlashError, NotFound

_RETRYABLE_CODES = {"ConditionalRequestConflict", "SlowDown", "InternalError", "ServiceUnavailable", "RequestTimeout"}


class S3Storage(Storage):
    def __init__(
        self,
        uri: str,
        endpoint_url: str | None = None,
        region: str | None = None,
        client: Any = None,
        max_attempts: int = 10,
    ) -> None:
        import boto3
        from botocore.config import Config

        rest = uri[len("s3://") :]
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise FlashError(f"invalid catalog URI {uri!r}: use s3://bucket/prefix")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.uri = uri.rstrip("/")
        self.endpoint_url = endpoint_url or os.environ.get("FLASH_S3_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL")
        self.region = region or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        self.max_attempts = max_attempts
        if client is None:
            config = Config(
                retries={"max_attempts": max_attempts, "mode": "standard"},
                connect_timeout=5,
                read_timeout=30,
            )
            client = boto3.client("s3", endpoint_url=self.endpoint_url, region_name=self.region, config=config)
        self.client = client

    # Pickling: Ray tasks receive the storage; a boto3 client does not pickle, so rebuild it.
    def __getstate__(self) -> dict[str, Any]:
        return {"uri": self.uri, "endpoint_url": self.endpoint_url, "region": self.region, "max_attempts": self.max_attempts}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["uri"], endpoint_url=state["endpoint_url"], region=state["region"], max_attempts=state["max_attempts"])  # type: ignore[misc]

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _strip(self, full: str) -> str:
        return full[len(self.prefix) + 1 :] if self.prefix else full

    def _call(self, fn: Any, **kwargs: Any) -> Any:
        """Call with an extra layer of retries for S3 codes botocore does not retry by itself."""
        from botocore.exceptions import ClientError

        delay = 0.05
        for attempt in range(self.max_attempts):
            try:
                return fn(**kwargs)
            except ClientError as exc:
                code = exc.response.get("Error", {}).get("Code", "")
                if code in _RETRYABLE_CODES and attempt + 1 < self.max_attempts:
                    time.sleep(delay)
                    delay = min(delay * 2, 2.0)
                    continue
                raise
        raise AssertionError("unreachable")

    def read(self, key: str) -> bytes:
        from botocore.exceptions import ClientError

        try:
            resp = self._call(self.client.get_object, Bucket=self.bucket, Key=self._key(key))
            return resp["Body"].read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                raise NotFound(f"{key} not found in lake {self.uri}") from None
            raise

    def write(self, key: str, data: bytes) -> None:
        self._call(self.client.put_object, Bucket=self.bucket, Key=self._key(key), Body=data)

    def create(self, key: str, data: bytes) -> bool:
        from botocore.exceptions import ClientError

        try:
            self._call(self.client.put_object, Bucket=self.bucket, Key=self._key(key), Body=data, IfNoneMatch="*")
            return True
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("PreconditionFailed", "412"):
                try:
                    return self.read(key) == data
                except NotFound:
                    return False
            raise

    def list(self, prefix: str) -> list[str]:
        full = self._key(prefix) if prefix else (self.prefix + "/" if self.prefix else "")
        out: list[str] = []
        token = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": full}
            if token:
                kwargs["ContinuationToken"] = token
            resp = self._call(self.client.list_objects_v2, **kwargs)
            for obj in resp.get("Contents", []):
                key = self._strip(obj["Key"])
                if prefix and not (key == prefix or key.startswith(prefix.rstrip("/") + "/")):
                    continue
                out.append(key)
            if not resp.get("IsTruncated"):
                break
            token = resp["NextContinuationToken"]
        return sorted(out)

    def list_children(self, prefix: str) -> list[str]:
        full = (self._key(prefix) if prefix else self.prefix).rstrip("/")
        full = full + "/" if full else ""
        names: set[str] = set()
        token = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": full, "Delimiter": "/"}
            if token:
                kwargs["ContinuationToken"] = token
            resp = self._call(self.client.list_objects_v2, **kwargs)
            for cp in resp.get("CommonPrefixes", []):
                names.add(cp["Prefix"][len(full) :].rstrip("/"))
            for obj in resp.get("Contents", []):
                names.add(obj["Key"][len(full) :])
            if not resp.get("IsTruncated"):
                break
            token = resp["NextContinuationToken"]
        return sorted(n for n in names if n)

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self._call(self.client.head_object, Bucket=self.bucket, Key=self._key(key))
            return True
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise

    def delete(self, key: str) -> None:
        self._call(self.client.delete_object, Bucket=self.bucket, Key=self._key(key))

    def upload(self, local_path: str | Path, key: str) -> int:
        data = Path(local_path).read_bytes()
        self.write(key, data)
        return len(data)

    def arrow_source(self, key: str) -> Any:
        return pa.BufferReader(self.read(key))

    def size(self, key: str) -> int:
        from botocore.exceptions import ClientError

        try:
            return int(self._call(self.client.head_object, Bucket=self.bucket, Key=self._key(key))["ContentLength"])
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                raise NotFound(f"{key} not found in lake {self.uri}") from None
            raise
