"""The code location loads from tables.yaml, passes `dagster definitions validate`, and one entry adds a table."""

import os
import subprocess
import sys

import pytest
from dagster_helpers import REPO, write_config
from dagster import AssetKey, Definitions

from resources.config import ConfigError, load_config, parse_partition_key, partition_key


def test_code_location_builds_everything_from_tables_yaml() -> None:
    import assets

    defs = assets.defs
    assert isinstance(defs, Definitions)
    project = load_config()
    keys = {s.key for s in defs.resolve_all_asset_specs()}
    for t in project.tables:
        for leaf in ("deltas", "compacted", "pk_index", "index_rehash", "optimized"):
            assert AssetKey([t.name, leaf]) in keys
        assert defs.resolve_job_def(t.compact_job_name)
        assert defs.resolve_job_def(t.optimize_job_name)
        assert defs.resolve_job_def(t.rehash_job_name)
    assert defs.resolve_sensor_def("new_delta_sensor")
    assert defs.resolve_sensor_def("sqs_job_run_dispatcher")
    checks = {c.name for c in defs.resolve_asset_graph().asset_check_keys}
    assert checks == {"primary_keys_unique", "index_rows_match_compacted", "index_pointers_resolve", "files_intact"}
    assert set(defs.resources) >= {"catalog", "ray", "pyspark", "sqs"}
    # the engine stays free of dagster (also covered by tests/test_skeleton.py), the spark package too
    code = "import sys, flash_pipeline.spark.order_status; print('dagster' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


def test_dagster_definitions_validate_passes(tmp_path) -> None:
    env = dict(os.environ, FLASH_LAKE=str(tmp_path / "lake"), DAGSTER_HOME=str(tmp_path))
    dagster = os.path.join(os.path.dirname(sys.executable), "dagster")
    out = subprocess.run([dagster, "definitions", "validate", "-w", "workspace.yaml"], capture_output=True, text=True,
                         cwd=REPO, env=env, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Validation successful" in out.stdout + out.stderr


def test_adding_a_table_is_one_entry(tmp_path) -> None:
    from assets.definitions import build_definitions

    base = write_config(tmp_path)
    one_more = base.read_text() + "  - {name: third, source: T.THIRD, primary_keys: [k]}\n"
    (tmp_path / "x").mkdir()
    defs = build_definitions(write_config(tmp_path / "x", one_more), str(tmp_path / "lake"))
    keys = {s.key for s in defs.resolve_all_asset_specs()}
    assert {AssetKey(["third", "compacted"]), AssetKey(["third", "pk_index"]), AssetKey(["third", "index_rehash"])} <= keys
    t = load_config(tmp_path / "x" / "tables.yaml").table("third")
    assert t.destination == "T.THIRD_COMPACTED" and t.options.hash_bucket_count is None and t.trigger.mode == "immediate"


@pytest.mark.parametrize(
    "entry, message",
    [
        ("{name: 'bad name', source: A, primary_keys: [k]}", "name"),
        ("{name: a, primary_keys: [k]}", "source"),
        ("{name: a, source: A, primary_keys: []}", "primary_keys"),
        ("{name: a, source: A, primary_keys: [k], hash_buckets: 0}", "hash_buckets"),
        ("{name: a, source: A, primary_keys: [k], trigger: {policy: sometimes}}", "policy"),
        ("{name: a, source: A, primary_keys: [k], trigger: {policy: upsolver, min_file: 3}}", "min_file"),
        ("{name: a, source: A, primary_keys: [k], colour: red}", "colour"),
        ("{name: a, source: A, primary_keys: [k], trigger: {policy: upsolver, min_files: 0}}", r"trigger\.min_files"),
        ("{name: a, source: A, primary_keys: [k], optimize: {min_file_size: 0}}", "optimize.min_file_size"),
        ("{name: a, source: A, primary_keys: [k], optimize: {max_size: 5}}", "max_size"),
        ("{name: a, source: A, primary_keys: [k], load: {orders: many}}", r"load\.orders"),
        ("{name: a, source: A, primary_keys: [k], load: {days: 0}}", r"load\.days"),
        ("{name: a, source: A, primary_keys: [k], load: {files_per_day: -1}}", r"load\.files_per_day"),
        ("{name: a, source: A, primary_keys: [k], load: {order: 5}}", r"tables\[0\] \(a\)\.load: unknown field\(s\) \['order'\]"),
        ("{name: a, source: A, primary_keys: [k], load: {generator: tpch}}", r"load\.generator"),
        ("{name: a, source: A, primary_keys: [k], load: 5}", r"load: give a mapping"),
        # two spellings of one option: one silently overrode the other
        ("{name: a, source: A, primary_keys: [k], primary_key: [x]}", r"'primary_keys' and 'primary_key' both give"),
        ("{name: a, source: A, primary_keys: [k], sort_keys: [t], sort_key: [u]}", r"'sort_keys' and 'sort_key' both give"),
        # a source that is not a table ID became a table named '' / 'None' / "['A', 'B']" (and '' broke every tick)
        ("{name: a, source: '', primary_keys: [k]}", r"tables\[0\] \(a\)\.source: give the source table's ID"),
        ("{name: a, source: null, primary_keys: [k]}", r"\.source: give the source table's ID"),
        ("{name: a, source: [A, B], primary_keys: [k]}", r"\.source: give the source table's ID"),
        ("{name: a, source: 5, primary_keys: [k]}", r"\.source: give the source table's ID"),
        # wrong shapes: bare TypeErrors and ValueErrors naming nothing
        ("orders", r"tables\[0\]: give a mapping"),
        ("{name: a, source: A, primary_keys: [k], trigger: immediate}", r"\.trigger: give a mapping"),
        ("{name: a, source: A, primary_keys: [k], batch: [1]}", r"\.batch: give a mapping"),
        ("{name: a, source: A, primary_keys: [k], destination: 7}", r"\(a\)\.destination: destination must be"),
    ],
)
def test_bad_table_entries_name_the_field(tmp_path, entry: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(write_config(tmp_path, f"tables:\n  - {entry}\n"))


@pytest.mark.parametrize(
    "text, message",
    [
        ("tabels:\n  - {name: a, source: A, primary_keys: [k]}\n", r"unknown top-level field\(s\) \['tabels'\]"),
        ("tables: {name: a, source: A, primary_keys: [k]}\n", r"'tables' must be a list"),
        ("defaults: [a]\ntables: []\n", r"'defaults' must be a mapping"),
        ("- a\n", r"give a mapping with 'tables'"),
        ("tables: [{name: a, source: A, primary_keys: [k]\n", r"not valid YAML"),
        ("tables:\n  - {name: o, source: A, primary_keys: [k]}\n  - {name: o_batch, source: B, primary_keys: [k]}\n",
         r"tables 'o' and 'o_batch' both need the Dagster job name 'compact_o_batch'"),
    ],
)
def test_a_malformed_config_file_is_one_error_naming_the_file(tmp_path, text: str, message: str) -> None:
    """Wrong shapes at the top of tables.yaml were bare TypeErrors or ValueErrors, a typo (``tabels:``) loaded no
    table at all, and two tables whose job names meet failed in Dagster's duplicate-job check."""
    path = write_config(tmp_path, text)
    with pytest.raises(ConfigError, match=message) as caught:
        load_config(path)
    assert "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match=r"cannot be read"):
        load_config(tmp_path / "missing.yaml")


@pytest.mark.parametrize("trigger", ["{mode: upsolver, min_files: 3}", "{policy: upsolver, min_files: 3}"])
def test_a_trigger_given_by_its_field_name_or_its_alias_loads(tmp_path, trigger: str) -> None:
    """The loader's default ``policy: immediate`` met a ``mode:`` the file gave as two spellings of one option."""
    t = load_config(write_config(tmp_path, f"tables:\n  - {{name: a, source: A, primary_keys: [k], trigger: {trigger}}}\n")).table("a")
    assert t.trigger.mode == "upsolver" and t.trigger.many_files == 3


def test_an_entry_spelling_an_option_otherwise_still_overrides_the_defaults(tmp_path) -> None:
    text = ("defaults:\n  sort_keys: ['a:descending']\n  hash_buckets: 3\ntables:\n"
            "  - {name: a, source: A, primary_key: [k], sort_key: ['b:ascending'], hash_bucket_count: 5}\n")
    t = load_config(write_config(tmp_path, text)).table("a")
    assert t.primary_keys == ("k",) and list(t.sort_keys) == [("b", "ascending")] and t.options.hash_bucket_count == 5


@pytest.mark.parametrize("second", ["{name: b, source: B, destination: OUT, primary_keys: [k]}", "{name: b, source: A, primary_keys: [k]}"])
def test_two_tables_compacting_into_one_destination_are_refused_at_load(tmp_path, second: str) -> None:
    """Each compaction would replace the other's rows in the shared destination (once, both runs succeeded and the
    destination held one source's rows only)."""
    first = "{name: a, source: A, destination: OUT, primary_keys: [k]}" if "OUT" in second else "{name: a, source: A, primary_keys: [k]}"
    with pytest.raises(ConfigError, match=r"tables \['a', 'b'\] compact into the same destination"):
        load_config(write_config(tmp_path, f"tables:\n  - {first}\n  - {second}\n"))


@pytest.mark.parametrize(
    "partition",
    [(), (("order_day", "1995-04-03"),), (("Order Day", "a,b/c=d!%"),), (("a", None), ("b", "")), (("a", "!"),), (("x", "2024-01-01 10:00:00"),)],
)
def test_partition_keys_round_trip_without_commas(partition) -> None:
    key = partition_key(partition)
    assert "," not in key and key
    assert parse_partition_key(key) == partition
    assert partition_key((("order_day", "1995-04-03"),)) == "order_day=1995-04-03"


def test_the_dagster_layer_imports_one_way_and_each_package_imports_alone() -> None:
    """assets/ -> sensors/ -> resources/ (docs/architecture.md): nothing below imports back up, so `import
    sensors` works on its own (it failed with a circular import through assets.keys)."""
    import ast
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    above = {"sensors": {"assets"}, "resources": {"assets", "sensors"}}
    for package, forbidden in above.items():
        for path in sorted((repo / package).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                bad = [n for n in names if n.split(".")[0] in forbidden]
                assert not bad, f"{path.relative_to(repo)} imports {bad}: the Dagster layer imports downwards only"
    for module in ("resources", "sensors", "sensors.new_deltas", "sensors.lake_observations", "sensors.sqs_dispatch", "assets"):
        done = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=repo, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"import {module}: {done.stderr.strip().splitlines()[-1:]}"
