"""S3 storage through boto3: ``s3://bucket/prefix``.

Two layers of retries, because an endpoint outage outlasts botocore's own: botocore's retry mode (``standard``
by default: jittered exponential backoff over ``max_attempts`` attempts) retries each request; around it, every
call is retried with capped exponential backoff for connection-level errors (refused or dropped connections,
timeouts) and retryable S3 codes until ``retry_deadline`` seconds have passed since the call began. Jitter can
make botocore's attempts all fall inside a 30-second outage; the deadline cannot. Every option is a keyword,
an environment variable (``FLASH_S3_*``) and a CLI option (docs/cli.md), and travels with the pickled storage
to Ray tasks.

Conditional creates use ``If-None-Match: *``; if a retried create finds the key already holding exactly our
bytes, the first attempt had succeeded and the create counts as ours (every commit document carries a unique
commit id, so equal bytes mean the same writer).
"""

from __future__ import annotations

import builtins
import os
import random
import time
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa

from flash_pipeline.catalog.ranged_objects import WHOLE_OBJECT_BYTES, RangedObject
from flash_pipeline.catalog.storage import Storage, read_ahead_setting
from flash_pipeline.errors import FlashError, NotFound

_RETRYABLE_CODES = {
    "ConditionalRequestConflict", "SlowDown", "InternalError", "ServiceUnavailable", "RequestTimeout",
    "Throttling", "ThrottlingException", "500", "502", "503", "504",
}
RETRY_MODES = ("standard", "adaptive", "legacy")

# option name -> (environment variable, parser, default); the defaults ride out a 30 s endpoint outage
S3_OPTIONS: dict[str, tuple[str, Callable[[str], Any], Any]] = {
    "retry_mode": ("FLASH_S3_RETRY_MODE", str, "standard"),
    "max_attempts": ("FLASH_S3_MAX_ATTEMPTS", int, 5),
    "connect_timeout": ("FLASH_S3_CONNECT_TIMEOUT", float, 5.0),
    "read_timeout": ("FLASH_S3_READ_TIMEOUT", float, 30.0),
    "retry_deadline": ("FLASH_S3_RETRY_DEADLINE", float, 120.0),
}
_BACKOFF_START, _BACKOFF_CAP = 0.2, 5.0


def resolve_s3_options(**given: Any) -> dict[str, Any]:
    """Each option from its keyword, else its environment variable, else the default; checked, so a bad value
    is one line naming the option instead of a botocore traceback later."""
    out: dict[str, Any] = {}
    for name, (env, parse, default) in S3_OPTIONS.items():
        value, source = given.get(name), name
        if value is None and os.environ.get(env, "").strip():
            value, source = os.environ[env].strip(), env
        if value is None:
            value = default
        try:
            value = parse(value)
        except (TypeError, ValueError):
            raise FlashError(f"invalid S3 option {source}={value!r}: give a number") from None
        if name == "retry_mode":
            value = value.lower()
            if value not in RETRY_MODES:
                raise FlashError(f"invalid S3 option {source}={value!r}: use one of {', '.join(RETRY_MODES)}")
        elif name == "max_attempts" and value < 1:
            raise FlashError(f"invalid S3 option {source}={value!r}: give a positive integer")
        elif name in ("connect_timeout", "read_timeout") and not value > 0:
            raise FlashError(f"invalid S3 option {source}={value!r}: give a positive number of seconds")
        elif name == "retry_deadline" and not value >= 0:
            raise FlashError(f"invalid S3 option {source}={value!r}: give seconds >= 0 (0 turns the outer retries off)")
        out[name] = value
    return out


class S3Storage(Storage):
    def __init__(
        self,
        uri: str,
        endpoint_url: str | None = None,
        region: str | None = None,
        client: Any = None,
        read_ahead: int | None = None,
        **retries: Any,
    ) -> None:
        """``retries``: the options of S3_OPTIONS by name (max_attempts, retry_mode, connect_timeout,
        read_timeout, retry_deadline); each one not given comes from its environment variable or its default."""
        import boto3
        from botocore.config import Config

        rest = uri[len("s3://") :]
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise FlashError(f"invalid catalog URI {uri!r}: use s3://bucket/prefix")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.uri = uri.rstrip("/")
        self.endpoint_url = (endpoint_url or os.environ.get("FLASH_S3_ENDPOINT_URL")
                             or os.environ.get("AWS_ENDPOINT_URL"))
        self.region = region or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        unknown = sorted(set(retries) - set(S3_OPTIONS))
        if unknown:
            raise TypeError(f"S3Storage() got unexpected keyword argument(s) {', '.join(unknown)}: "
                            f"the S3 options are {', '.join(S3_OPTIONS)}")
        self.options = resolve_s3_options(**retries)
        self.read_ahead = read_ahead if read_ahead is not None else read_ahead_setting(8)
        self.max_attempts: int = self.options["max_attempts"]
        self.retry_deadline: float = self.options["retry_deadline"]
        if client is None:
            config = Config(
                retries={"total_max_attempts": self.max_attempts, "mode": self.options["retry_mode"]},
                connect_timeout=self.options["connect_timeout"],
                read_timeout=self.options["read_timeout"],
            )
            client = boto3.client("s3", endpoint_url=self.endpoint_url, region_name=self.region, config=config)
        self.client = client

    # Pickling: Ray tasks receive the storage; a boto3 client does not pickle, so rebuild it with the same
    # (already resolved) options, whatever the environment of the worker says.
    def __getstate__(self) -> dict[str, Any]:
        return {"uri": self.uri, "endpoint_url": self.endpoint_url, "region": self.region,
                "read_ahead": self.read_ahead, **self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        self.__init__(state.pop("uri"), **state)  # type: ignore[misc]

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _strip(self, full: str) -> str:
        return full[len(self.prefix) + 1 :] if self.prefix else full

    def _call(self, fn: Any, **kwargs: Any) -> Any:
        """``fn(**kwargs)`` (one botocore call, itself retried by the retry mode), retried again with capped,
        jittered exponential backoff on connection-level errors and retryable codes until ``retry_deadline``
        seconds after the first try. Every call we make is idempotent or a conditional create whose retry
        finds its own object (see :meth:`create`), so repeating one whose answer was lost is safe."""
        from botocore.exceptions import ClientError, HTTPClientError
        from botocore.exceptions import ConnectionError as BotoConnectionError

        deadline = time.monotonic() + self.retry_deadline
        delay = _BACKOFF_START
        while True:
            try:
                return fn(**kwargs)
            except (BotoConnectionError, HTTPClientError) as exc:
                last: Exception = exc  # refused, dropped, timed out, or a body cut short: it may come back
            except ClientError as exc:
                code = str(exc.response.get("Error", {}).get("Code", ""))
                if code == "NoSuchBucket":
                    raise FlashError(
                        f"S3 bucket {self.bucket!r} of catalog {self.uri} does not exist: create it "
                        f"(aws s3 mb s3://{self.bucket}) or fix --catalog"
                    ) from None
                if code not in _RETRYABLE_CODES:
                    raise
                last = exc
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise last  # the deadline has passed: the last error stands
            # the last try lands at the deadline, not one pause before it
            time.sleep(min(remaining, min(delay, _BACKOFF_CAP) * (0.5 + random.random() / 2)))
            delay *= 2

    def read(self, key: str) -> bytes:
        from botocore.exceptions import ClientError

        def get(**kwargs: Any) -> bytes:
            # the body is read inside the retried call: a connection cut mid-body is retried like any other
            return self.client.get_object(**kwargs)["Body"].read()

        try:
            return self._call(get, Bucket=self.bucket, Key=self._key(key))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                raise NotFound(f"{key} not found in lake {self.uri}") from None
            raise

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        if length <= 0:
            return b""
        from botocore.exceptions import ClientError

        def get(**kwargs: Any) -> bytes:
            return self.client.get_object(**kwargs)["Body"].read()

        try:
            return self._call(get, Bucket=self.bucket, Key=self._key(key),
                              Range=f"bytes={offset}-{offset + length - 1}")
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code in ("NoSuchKey", "404", "NotFound"):
                raise NotFound(f"{key} not found in lake {self.uri}") from None
            if code in ("InvalidRange", "416"):
                return b""
            raise

    def write(self, key: str, data: bytes | memoryview) -> None:
        body = bytes(data) if isinstance(data, memoryview) else data  # botocore takes bytes or a file object
        self._call(self.client.put_object, Bucket=self.bucket, Key=self._key(key), Body=body)

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

    def list_children(self, prefix: str, starting_with: str = "", start_after: str = "") -> builtins.list[str]:
        full = (self._key(prefix) if prefix else self.prefix).rstrip("/")
        full = full + "/" if full else ""
        names: set[str] = set()
        token = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": full + starting_with, "Delimiter": "/"}
            if start_after:
                kwargs["StartAfter"] = full + start_after
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
        return sorted(n for n in names if n and n > start_after)

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
        """The object as PyArrow reads it: whole in memory up to WHOLE_OBJECT_BYTES (one GET), else a file whose
        reads are ranged GETs (catalog/ranged_objects.py), so a reader fetches only the parts it decodes."""
        tail, size = self.read_tail(key, WHOLE_OBJECT_BYTES)
        if len(tail) >= size:
            return pa.BufferReader(tail)
        return pa.PythonFile(RangedObject(lambda offset, length: self.read_range(key, offset, length), size, tail),
                             mode="r")

    def read_tail(self, key: str, length: int) -> tuple[bytes, int]:
        """The last ``length`` bytes of ``key`` (all of it when it is smaller) and the object's size, in one GET
        (``Range: bytes=-length``, the size from ``Content-Range``); raises NotFound."""
        from botocore.exceptions import ClientError

        def get(**kwargs: Any) -> tuple[bytes, int]:
            answer = self.client.get_object(**kwargs)
            body = answer["Body"].read()
            content_range = str(answer.get("ContentRange") or "")
            total = content_range.rpartition("/")[2]
            return body, int(total) if total.isdigit() else len(body)

        try:
            return self._call(get, Bucket=self.bucket, Key=self._key(key), Range=f"bytes=-{length}")
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code in ("NoSuchKey", "404", "NotFound"):
                raise NotFound(f"{key} not found in lake {self.uri}") from None
            if code in ("InvalidRange", "416"):  # an empty object has no last bytes
                return b"", 0
            raise

    def size(self, key: str) -> int:
        from botocore.exceptions import ClientError

        try:
            return int(self._call(self.client.head_object, Bucket=self.bucket, Key=self._key(key))["ContentLength"])
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                raise NotFound(f"{key} not found in lake {self.uri}") from None
            raise
