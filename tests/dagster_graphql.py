"""A tiny client for the Dagster webserver's GraphQL API (used by the UI test)."""

import json
import time
import urllib.request
from typing import Any


# how often run and backfill status is polled: a cheap query; a coarser poll only adds to each wait (by half of it on average)
POLL_SECONDS = 0.5


class GraphQL:
    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/") + "/graphql"

    def __call__(self, query: str, **variables: Any) -> dict[str, Any]:
        req = urllib.request.Request(self.url, data=json.dumps({"query": query, "variables": variables}).encode(),
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            body = json.loads(resp.read())
        if body.get("errors"):
            raise AssertionError(body["errors"])
        return body["data"]

    def add_partition(self, location: str, partitions_def: str, key: str) -> None:
        data = self("""mutation($sel: RepositorySelector!, $name: String!, $key: String!) {
            addDynamicPartition(repositorySelector: $sel, partitionsDefName: $name, partitionKey: $key) {
              __typename ... on PythonError { message } ... on UnauthorizedError { message } } }""",
                    sel={"repositoryLocationName": location, "repositoryName": "__repository__"}, name=partitions_def, key=key)
        kind = data["addDynamicPartition"]["__typename"]
        assert kind in ("AddDynamicPartitionSuccess", "DuplicateDynamicPartitionError"), data

    def launch(self, location: str, job: str, partition_key: str, run_config: dict[str, Any] | None = None) -> str:
        params: dict[str, Any] = {
            "selector": {"repositoryLocationName": location, "repositoryName": "__repository__", "jobName": job},
            "executionMetadata": {"tags": [{"key": "dagster/partition", "value": partition_key}]},
        }
        if run_config is not None:
            params["runConfigData"] = run_config
        data = self("""mutation($p: ExecutionParams!) { launchRun(executionParams: $p) {
              __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
              ... on InvalidSubsetError { message } ... on RunConfigValidationInvalid { errors { message } } } }""",
                    p=params)
        result = data["launchRun"]
        assert result["__typename"] == "LaunchRunSuccess", result
        return result["run"]["runId"]

    def wait(self, run_id: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self("""query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }""", id=run_id)["runOrError"]["status"]
            if status in ("SUCCESS", "FAILURE", "CANCELED"):
                return status
            time.sleep(POLL_SECONDS)
        raise AssertionError(f"run {run_id} still {status} after {timeout}s")

    def messages(self, run_id: str) -> list[str]:
        """Every log message of a run (the engine's progress lines, the failure's description)."""
        data = self("""query($id: ID!) { logsForRun(runId: $id) { __typename ... on EventConnection {
              events { __typename ... on MessageEvent { message } } } } }""", id=run_id)
        return [e.get("message") or "" for e in data["logsForRun"]["events"]]

    def step_failure(self, run_id: str) -> dict[str, Any]:
        """The description and metadata (label -> text) of a run's step failure (``dagster.Failure``)."""
        data = self("""query($id: ID!) { logsForRun(runId: $id) { ... on EventConnection { events { __typename
              ... on ExecutionStepFailureEvent { failureMetadata { description metadataEntries { label __typename
                ... on TextMetadataEntry { text } ... on IntMetadataEntry { intValue } ... on MarkdownMetadataEntry { mdStr } } } } } } } }""",
                    id=run_id)
        failures = [e for e in data["logsForRun"]["events"] if e["__typename"] == "ExecutionStepFailureEvent"]
        assert failures, f"run {run_id} has no step failure"
        meta = failures[0]["failureMetadata"]
        return {"description": meta["description"],
                "metadata": {e["label"]: e.get("text", e.get("intValue", e.get("mdStr"))) for e in meta["metadataEntries"]}}

    def backfill(self, assets: list[list[str]], partitions: list[str]) -> str:
        data = self("""mutation($p: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $p) {
              __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } ... on PartitionSetNotFoundError { message } } }""",
                    p={"assetSelection": [{"path": a} for a in assets], "partitionNames": partitions})
        result = data["launchPartitionBackfill"]
        assert result["__typename"] == "LaunchBackfillSuccess", result
        return result["backfillId"]

    def wait_backfill(self, backfill_id: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        status = "?"
        while time.monotonic() < deadline:
            status = self("""query($id: String!) { partitionBackfillOrError(backfillId: $id) { ... on PartitionBackfill { status } } }""",
                          id=backfill_id)["partitionBackfillOrError"]["status"]
            if status in ("COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"):
                return status
            time.sleep(POLL_SECONDS)
        raise AssertionError(f"backfill {backfill_id} still {status} after {timeout}s")

    def start_sensor(self, location: str, name: str) -> None:
        data = self("""mutation($s: SensorSelector!) { startSensor(sensorSelector: $s) { __typename ... on PythonError { message } } }""",
                    s={"repositoryLocationName": location, "repositoryName": "__repository__", "sensorName": name})
        assert data["startSensor"]["__typename"] == "Sensor", data

    def materialization_metadata(self, path: list[str], partition: str) -> dict[str, Any]:
        data = self("""query($key: AssetKeyInput!, $p: [String!]) { assetOrError(assetKey: $key) { ... on Asset {
              assetMaterializations(partitions: $p, limit: 1) { partition metadataEntries { label __typename
                ... on IntMetadataEntry { intValue } ... on FloatMetadataEntry { floatValue } ... on TextMetadataEntry { text } } } } } }""",
                    key={"path": path}, p=[partition])
        mats = data["assetOrError"]["assetMaterializations"]
        assert mats, f"no materialization of {path} [{partition}]"
        out = {}
        for e in mats[0]["metadataEntries"]:
            out[e["label"]] = e.get("intValue", e.get("floatValue", e.get("text")))
        return out

    def check_results(self, path: list[str]) -> dict[str, str]:
        data = self("""query($key: AssetKeyInput!) { assetNodeOrError(assetKey: $key) { ... on AssetNode {
              assetChecksOrError { ... on AssetChecks { checks { name executionForLatestMaterialization { status } } } } } } }""",
                    key={"path": path})
        checks = data["assetNodeOrError"]["assetChecksOrError"]["checks"]
        return {c["name"]: (c["executionForLatestMaterialization"] or {}).get("status") for c in checks}
