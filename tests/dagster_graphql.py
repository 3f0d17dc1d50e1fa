"""A tiny client for the Dagster webserver's GraphQL API (used by the UI test)."""

import json
import time
import urllib.request
from typing import Any


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

    def launch(self, location: str, job: str, partition_key: str) -> str:
        data = self("""mutation($p: ExecutionParams!) { launchRun(executionParams: $p) {
              __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
              ... on InvalidSubsetError { message } ... on RunConfigValidationInvalid { errors { message } } } }""",
                    p={"selector": {"repositoryLocationName": location, "repositoryName": "__repository__", "jobName": job},
                       "executionMetadata": {"tags": [{"key": "dagster/partition", "value": partition_key}]}})
        result = data["launchRun"]
        assert result["__typename"] == "LaunchRunSuccess", result
        return result["run"]["runId"]

    def wait(self, run_id: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self("""query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }""", id=run_id)["runOrError"]["status"]
            if status in ("SUCCESS", "FAILURE", "CANCELED"):
                return status
            time.sleep(2)
        raise AssertionError(f"run {run_id} still {status} after {timeout}s")

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
