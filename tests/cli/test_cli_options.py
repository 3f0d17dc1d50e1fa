"""The CLI's flags are generated from the options model: one per field, converted by the field's own parser."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from flash_pipeline.cli import build_parser, main
from flash_pipeline.cli.compaction import _trigger_policy
from flash_pipeline.cli.flags import flag_of, model_from_args
from flash_pipeline.compactor.model.options import CompactOptions, option_fields
from flash_pipeline.triggers import DAY, TriggerPolicy


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


@pytest.mark.parametrize("field", [f for f in option_fields(CompactOptions) if f.name != "partitions"], ids=lambda f: f.name)
def test_compact_has_one_flag_per_option(field: dataclasses.Field) -> None:
    flags = {s for a in _subparser("compact")._actions for s in a.option_strings}
    assert flag_of(field) in flags


BAD_FLAGS = [("--hash-buckets", "0"), ("--hash-buckets", "5000"), ("--rows-per-file", "x"), ("--rows-per-index-file", "-3"),
             ("--sort-key", "a:sideways"), ("--format", "xlsx"), ("--desired-sla", "-1"), ("--num-cpus", "0"),
             ("--max-round-bytes", "many"), ("--primary-key", "")]


@pytest.mark.parametrize(("flag", "value"), BAD_FLAGS)
def test_a_bad_option_value_is_a_one_line_usage_error(tmp_path, capsys: pytest.CaptureFixture[str], flag: str, value: str) -> None:
    code = main(["compact", "--catalog", str(tmp_path / "lake"), "--table", "T", flag, value])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and flag in err
    assert not (tmp_path / "lake").exists()  # refused before the lake is touched


def test_generated_flags_build_the_same_options_as_the_api() -> None:
    args = _subparser("compact").parse_args(["--catalog", "x", "--table", "T", "--primary-key", "b", "--primary-key", "a",
                                             "--sort-key", "t:descending", "--hash-buckets", "8", "--format", "orc", "--rebuild"])
    assert model_from_args(CompactOptions, args) == CompactOptions(
        primary_keys=["a", "b"], sort_keys=["t:descending"], hash_bucket_count=8, compacted_file_content_type="orc", rebuild=True)


def test_earlier_trigger_flags_give_the_same_policy_as_the_model_flags() -> None:
    p = _subparser("auto")
    new = p.parse_args(["--catalog", "x", "--table", "T", "--policy", "upsolver", "--min-files", "7", "--quiet-seconds",
                        str(2 * DAY), "--max-files", "90", "--stale-seconds", str(3 * DAY), "--small-file-bytes", str(1 << 20),
                        "--max-pending-rows", "0"])
    old = p.parse_args(["--catalog", "x", "--table", "T", "--many-files", "7", "--many-files-age-days", "2", "--too-many-files", "90",
                        "--stale-days", "3", "--small-file-size", "1M", "--max-pending-rows", "0"])
    assert _trigger_policy(new) == _trigger_policy(old) == TriggerPolicy(
        many_files=7, many_files_min_age=2 * DAY, too_many_files=90, stale_age=3 * DAY, small_file_bytes=1 << 20, max_pending_rows=0)


def test_docs_cli_md_names_every_flag_of_every_command() -> None:
    """docs/cli.md is the contract other tools read: a flag the parser has and the doc lacks is an undocumented
    contract (three compact flags were missing)."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = sorted({f"{name} {flag}" for name, p in sub.choices.items() for a in p._actions for flag in a.option_strings
                      if flag.startswith("--") and flag != "--help" and flag not in doc})
    assert not missing, f"flags missing from docs/cli.md: {missing}"
