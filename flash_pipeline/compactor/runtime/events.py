"""Job-run events on SNS (``sns_event_topic_arn``): started, round completed, succeeded, failed with reason.

The endpoint follows boto3's usual configuration (``AWS_ENDPOINT_URL``), or ``FLASH_SNS_ENDPOINT_URL``.
Publishing never breaks a compaction: a failed publish is reported on stderr and the run goes on.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


class EventPublisher:
    def __init__(self, topic_arn: str | None) -> None:
        self.topic_arn = topic_arn
        self._client: Any = None
        if topic_arn:
            if not topic_arn.startswith("arn:"):
                from flash_pipeline.errors import FlashError

                raise FlashError(f"invalid SNS topic ARN {topic_arn!r}: expected arn:aws:sns:<region>:<account>:<name>")
            import boto3

            region = topic_arn.split(":")[3] or os.environ.get("AWS_DEFAULT_REGION", "us-east-1")
            endpoint = os.environ.get("FLASH_SNS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL")
            self._client = boto3.client("sns", region_name=region, endpoint_url=endpoint)

    def publish(self, event: str, **fields: Any) -> None:
        if self._client is None:
            return
        body = {"event": event, "time": time.time(), **fields}
        try:
            self._client.publish(
                TopicArn=self.topic_arn,
                Subject=f"flash-compactor {event}"[:100],
                Message=json.dumps(body, default=str),
                MessageAttributes={"event": {"DataType": "String", "StringValue": event}},
            )
        except Exception as exc:  # noqa: BLE001 - events are best effort
            print(f"flash-compactor: warning: could not publish {event} to {self.topic_arn}: {exc}", file=sys.stderr)
