"""Which data manifests an Iceberg snapshot lists, so that a commit writes in proportion to what changed.

A snapshot lists again, as they are, the previous snapshot's data manifests whose files are all still live
(Iceberg's "fast append": a manifest written by an earlier snapshot stays valid in a later one); the files this
version adds and the live files of the previous manifests that lost a file go into one new manifest. A spread
update with deletion vectors (every file carried, one added) writes a manifest of one file instead of one of
every live file. Past MAX_DATA_MANIFESTS, or when a column's type changed (bounds re-serialized), the snapshot
writes one manifest of every live file again.

Deciding needs each manifest's files without reading the manifests: a sidecar ``<v>-members-<hash>.json`` beside
the snapshot's metadata lists, per data manifest, its manifest-list record and its files' lake keys; the snapshot
summary names it (``flash.data-manifests``). A snapshot without one (written before, or in a lake copied from
elsewhere) makes the next commit write one manifest of every live file. Retention keeps every manifest a kept
snapshot's sidecar lists (iceberg_table.expire_iceberg).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import TYPE_CHECKING, Any

from flash_pipeline.catalog.iceberg_catalog import order_of
from flash_pipeline.catalog.iceberg_stats import lake_key
from flash_pipeline.errors import NotFound

if TYPE_CHECKING:
    from flash_pipeline.catalog.storage import Storage

MAX_DATA_MANIFESTS = 16
MEMBERS = "flash.data-manifests"  # snapshot summary: the location of the snapshot's members sidecar


def members_of(storage: "Storage", snapshot: dict[str, Any] | None) -> list[dict[str, Any]] | None:
    """The data manifests ``snapshot`` lists, each ``{"record": <manifest-list record>, "files": [keys]}``; None
    when it has no readable sidecar."""
    uri = (snapshot or {}).get("summary", {}).get(MEMBERS)
    if not uri:
        return None
    try:
        return list(json.loads(storage.read(lake_key(storage.uri, uri)))["manifests"])
    except (NotFound, ValueError, KeyError, TypeError):
        return None


def split(members: list[dict[str, Any]] | None, live: set[str],
          types_changed: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
    """(manifests listed again, manifests whose live files are rewritten); None: write one manifest of every
    live file (no sidecar, a type changed, or too many manifests)."""
    if members is None or types_changed:
        return None
    reused = [m for m in members if all(k in live for k in m["files"])]
    if len(reused) + 1 > MAX_DATA_MANIFESTS:
        return None
    return reused, [m for m in members if not all(k in live for k in m["files"])]


def sidecar(root: str, version: int, members: list[dict[str, Any]]) -> tuple[str, bytes]:
    """(key, bytes) of the members sidecar of snapshot ``version``: deterministic, named by its content."""
    data = json.dumps({"manifests": members}, sort_keys=True, separators=(",", ":")).encode()
    return f"{root}/metadata/{version}-members-{hashlib.sha256(data).hexdigest()[:16]}.json", data


def protected(storage: "Storage", meta: dict[str, Any]) -> set[str] | None:
    """Names (in the metadata folder) of the data manifests and sidecars the snapshots of ``meta`` use; None when
    a sidecar in this lake is gone (a racing writer's snapshot built on one a retention pass had just expired:
    found by tests/catalog/test_races.py), so that retention deletes no data manifest it cannot account for. One
    outside the lake (a copied lake's earlier snapshots) lists nothing here."""
    out = set()
    for snapshot in meta["snapshots"]:
        uri = snapshot.get("summary", {}).get(MEMBERS)
        if not uri:
            continue
        try:
            key = lake_key(storage.uri, uri)
        except NotFound:
            continue
        out.add(key.rsplit("/", 1)[-1])
        try:
            listed = json.loads(storage.read(key))["manifests"]
        except NotFound:
            return None
        out.update(m["record"]["manifest_path"].rsplit("/", 1)[-1] for m in listed)
    return out


_OURS = re.compile(r"^(?:snap-(\d+)-[0-9a-f]{16}\.avro|(\d+)-(?:(?:data|deletes)-[0-9a-f]{16}\.avro|"
                   r"members-[0-9a-f]{16}\.json))$")


def is_data_manifest(name: str) -> bool:
    """Is ``name`` (in the metadata folder) one of our data manifests, ``<N>-data-<hash>.avro``?"""
    found = _OURS.match(name)
    return found is not None and "-data-" in name


def expired_file(name: str, keep: set[int]) -> bool:
    """Whether a file of the metadata folder is ours and belongs to a snapshot not in ``keep`` (its version in its
    name: ``v<N>[-r<R>].metadata.json``, ``snap-<N>-<hash>.avro``, ``<N>-data-<hash>.avro``,
    ``<N>-deletes-<hash>.avro``, ``<N>-members-<hash>.json``). Any other name (another writer's file) is never expired
    here."""
    if name.startswith("v") and name.endswith(".metadata.json"):
        try:
            number = order_of(name)[0]
        except ValueError:
            return False
    elif found := _OURS.match(name):
        number = int(found.group(1) or found.group(2))
    else:
        return False
    return number not in keep
