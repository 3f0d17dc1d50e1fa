"""The Iceberg tables in a catalog the user runs (REST, AWS Glue, Hive, SQL on PostgreSQL...), through pyiceberg.

``FLASH_ICEBERG_CATALOG`` configures it: a JSON object of pyiceberg catalog properties (``{"type": "glue",
"glue.region": "eu-west-1"}``, ``{"type": "rest", "uri": "https://..."}``; ``"name"`` names it, default
``flash``), or the name of a catalog in ``~/.pyiceberg.yaml``. After a snapshot's metadata is written
(iceberg_table.py), the table ``(table ID, partition folder)`` is registered there the first time
(``register_table`` with our metadata file) and brought to each later snapshot by a commit through pyiceberg's
``commit_table``: the snapshots, schemas and properties our metadata has and the catalog's table has not, the
snapshots retention expired removed, ``main`` moved, conditional on the table's UUID and the snapshot ``main`` had
(a concurrent writer's commit fails it: re-read, and done when the table is already there). The catalog writes its
own metadata files (where ``write.metadata.path`` says: ``catalog-metadata/`` beside ours), over our manifests.

Why a commit of updates and not a swap of the metadata pointer: only the updates are a pyiceberg API every catalog
implements (a REST catalog writes its metadata itself). pyiceberg is imported only when a catalog is configured
(its import costs ~1.3 s a command).
"""

from __future__ import annotations

import functools
import json
import os
import threading
from typing import Any

from flash_pipeline.errors import FlashError

ATTEMPTS = 5
METADATA_FOLDER = "catalog-metadata"


def configured() -> dict[str, str] | None:
    """The configured catalog's properties (``name`` among them), None when none is configured."""
    raw = os.environ.get("FLASH_ICEBERG_CATALOG", "").strip()
    if not raw:
        return None
    if raw[0] in "{[\"":  # JSON (an object of properties is the only one taken); anything else names a catalog
        try:
            props = json.loads(raw)
        except json.JSONDecodeError as exc:
            props = exc
        if not isinstance(props, dict):
            raise FlashError(f"FLASH_ICEBERG_CATALOG is not a JSON object of pyiceberg catalog properties ({props}); "
                             "fix it, or unset it for the embedded catalog only")
        return {"name": "flash", **{str(k): str(v) for k, v in props.items()}}
    return {"name": raw}


_LOADING = threading.Lock()


def _catalog(config: str) -> Any:
    """The configured catalog, loaded once a process. Loading a SQL catalog creates its tables when missing, a
    check then a create: two sessions publishing at once (or two processes) raced into "table iceberg_tables
    already exists". Loads are serialized here, and one that lost to another process is retried once."""
    with _LOADING:
        try:
            return _load(config)
        except Exception as exc:  # noqa: BLE001 - only the lost creation race is retried
            if "already exists" not in str(exc):
                raise
            return _load(config)


@functools.lru_cache(maxsize=4)
def _load(config: str) -> Any:
    from pyiceberg.catalog import load_catalog

    props = json.loads(config)
    return load_catalog(props.pop("name"), **props)


def publish(identifier: list[str], metadata_location: str, metadata: dict[str, Any], root_uri: str) -> bool:
    """Bring the configured catalog's ``identifier`` to ``metadata`` (the file at ``metadata_location``) unless
    it holds it or a newer snapshot already. False when concurrent commits kept failing ours."""
    from pyiceberg.exceptions import CommitFailedException, NoSuchTableError, TableAlreadyExistsError

    config = configured()
    assert config is not None
    catalog = _catalog(json.dumps(config, sort_keys=True))
    ident = tuple(identifier)
    for _ in range(ATTEMPTS):
        try:
            table = catalog.load_table(ident)
        except NoSuchTableError:
            _ensure_namespace(catalog, ident[:-1])
            try:
                catalog.register_table(ident, metadata_location)
            except TableAlreadyExistsError:
                continue
            return True
        theirs = table.metadata
        if str(theirs.table_uuid) != metadata["table-uuid"] or theirs.location != metadata["location"]:
            raise ValueError(f"the Iceberg table {'.'.join(ident)} in catalog {config['name']!r} is another table "
                             f"(at {theirs.location}; another lake's?): drop it there or configure another catalog")
        if (theirs.current_snapshot_id or 0) > metadata["current-snapshot-id"]:
            return True  # a newer version is there already: never backwards
        updates = _updates(theirs, metadata, f"{root_uri}/{METADATA_FOLDER}")
        if not updates:
            return True
        from pyiceberg.table.update import AssertRefSnapshotId, AssertTableUUID

        try:
            catalog.commit_table(table, (AssertTableUUID(uuid=theirs.table_uuid), AssertRefSnapshotId.model_validate(
                {"ref": "main", "snapshot-id": theirs.current_snapshot_id})), tuple(updates))
            return True
        except CommitFailedException:
            continue
    return False


def _ensure_namespace(catalog: Any, namespace: tuple[str, ...]) -> None:
    """Create ``namespace`` unless it exists. pyiceberg checks, then inserts: a writer racing ours (two partitions'
    sessions publishing at once) can insert between the two, and its SQL catalog then raises the database's
    IntegrityError rather than NamespaceAlreadyExistsError. The namespace being there afterwards is what counts,
    so the outcome is read back."""
    try:
        catalog.create_namespace_if_not_exists(namespace)
    except Exception:
        if not catalog.namespace_exists(namespace):
            raise


def _updates(theirs: Any, ours: dict[str, Any], metadata_path: str) -> list[Any]:
    """The table updates that give the catalog's table ``ours``'s schemas, snapshots, main branch and properties."""
    from pyiceberg.schema import Schema
    from pyiceberg.table.snapshots import Snapshot
    from pyiceberg.table.update import (
        AddSchemaUpdate,
        AddSnapshotUpdate,
        RemoveSnapshotsUpdate,
        SetCurrentSchemaUpdate,
        SetPropertiesUpdate,
        SetSnapshotRefUpdate,
    )

    updates: list[Any] = []
    known = {s.schema_id: s for s in theirs.schemas}
    for raw in ours["schemas"]:
        schema = Schema.model_validate(raw)
        if schema.schema_id not in known:
            updates.append(AddSchemaUpdate(schema=schema))
        elif known[schema.schema_id].fields != schema.fields:
            raise ValueError(f"schema {schema.schema_id} of the catalog's table differs from ours: another writer "
                             "changed the table; drop it or configure another catalog")
    if theirs.current_schema_id != ours["current-schema-id"]:
        updates.append(SetCurrentSchemaUpdate.model_validate({"schema-id": ours["current-schema-id"]}))
    present = {s.snapshot_id for s in theirs.snapshots}
    wanted = {s["snapshot-id"] for s in ours["snapshots"]}
    for raw in sorted(ours["snapshots"], key=lambda s: s["sequence-number"]):
        if raw["snapshot-id"] not in present:
            updates.append(AddSnapshotUpdate(snapshot=Snapshot.model_validate(raw)))
    if theirs.current_snapshot_id != ours["current-snapshot-id"]:
        updates.append(SetSnapshotRefUpdate.model_validate({"ref-name": "main", "type": "branch",
                                                            "snapshot-id": ours["current-snapshot-id"]}))
    expired = sorted(present - wanted)
    if expired:
        updates.append(RemoveSnapshotsUpdate.model_validate({"snapshot-ids": expired}))
    props = {**ours["properties"], "write.metadata.path": metadata_path}
    changed = {k: v for k, v in props.items() if theirs.properties.get(k) != v}
    if changed:
        updates.append(SetPropertiesUpdate(updates=changed))
    return updates
