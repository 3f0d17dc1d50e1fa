"""CompactOptions and SortKey (model/options.py): parsed and validated once, the same from every spelling."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flash_pipeline import ContentType
from flash_pipeline.compactor.model.options import (
    STREAM_POSITION,
    CompactOptions,
    SortKey,
    option_fields,
    parse_sort_keys,
)
from flash_pipeline.errors import FlashError

names = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters=":"), min_size=1, max_size=12)
orders = st.sampled_from(["ascending", "descending"])


@settings(max_examples=200, deadline=None)
@given(names, orders, st.booleans())
def test_every_spelling_of_a_sort_key_parses_to_the_same_key(name: str, order: str, upper: bool) -> None:
    spelled = order.upper() if upper else order
    expected = SortKey(name, order)
    assert SortKey.parse(f"{name}:{spelled}") == expected
    assert SortKey.parse((name, spelled)) == expected
    assert SortKey.parse({"column": name, "order": spelled}) == expected
    assert SortKey.parse(expected) == expected == (name, order)  # a tuple: equal to the recorded pair
    if order == "ascending":
        assert SortKey.parse(name) == expected


@settings(max_examples=100, deadline=None)
@given(names, names)
def test_a_column_with_a_colon_needs_its_order(a: str, b: str) -> None:
    assert SortKey.parse(f"{a}:{b}:descending") == SortKey(f"{a}:{b}", "descending")
    if b.lower() not in ("ascending", "descending"):
        with pytest.raises(FlashError, match="ascending or descending"):
            SortKey.parse(f"{a}:{b}")


def test_the_stream_position_is_implicit_and_only_ascending() -> None:
    assert parse_sort_keys([STREAM_POSITION, "x:descending"]) == (SortKey("x", "descending"),)
    with pytest.raises(FlashError, match="only be ascending"):
        parse_sort_keys([f"{STREAM_POSITION}:descending"])
    with pytest.raises(FlashError):
        parse_sort_keys([":ascending"])


def _alias(f: dataclasses.Field) -> str:
    return f.metadata.get("alias") or f.name


VALUES = {  # one valid value per option, in the spelling a config file would use
    "primary_keys": ["b", "a", "b"], "sort_keys": ["t:descending"], "desired_sla": 30,
    "destination_compacted_table_id": "X.Y", "rows_per_primary_key_index_file": 10, "rows_per_compacted_file": 5,
    "hash_bucket_count": 8, "sns_event_topic_arn": "arn:aws:sns:us-east-1:1:t", "compacted_file_content_type": "ORC",
    "partitions": [{"d": "1"}], "rebuild": True, "num_cpus": 2, "ray_address": "127.0.0.1:6379", "max_round_bytes": 1 << 20,
    "executor": "in-process", "deletion_vectors": "off",
}
BAD = {
    "primary_keys": [""], "sort_keys": ["t:sideways"], "desired_sla": -1, "destination_compacted_table_id": "",
    "rows_per_primary_key_index_file": 0, "rows_per_compacted_file": "x", "hash_bucket_count": 4097,
    "sns_event_topic_arn": 3, "compacted_file_content_type": "xlsx", "partitions": ["nope"], "rebuild": "yes",
    "num_cpus": 0, "ray_address": "", "max_round_bytes": -5,
    "executor": "spark", "deletion_vectors": "sometimes",
}


def test_every_option_has_a_case_here() -> None:
    assert {f.name for f in option_fields(CompactOptions)} == set(VALUES) == set(BAD)


@pytest.mark.parametrize("name", sorted(VALUES))
def test_field_names_and_aliases_build_the_same_options(name: str) -> None:
    field = {f.name: f for f in option_fields(CompactOptions)}[name]
    by_name = CompactOptions(**{name: VALUES[name]})
    assert CompactOptions.from_mapping({name: VALUES[name]}) == by_name
    assert CompactOptions.from_mapping({_alias(field): VALUES[name]}) == by_name
    assert getattr(by_name, name) is not None
    assert CompactOptions.from_mapping({_alias(field): None}) == CompactOptions()


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_value_is_refused_naming_the_option(name: str) -> None:
    with pytest.raises(FlashError) as err:
        CompactOptions.from_mapping({name: BAD[name]}, where="table t")
    assert str(err.value).startswith(f"table t.{name}: ") and "\n" not in str(err.value)


def test_values_are_normalised_once() -> None:
    o = CompactOptions(**VALUES)
    assert o.primary_keys == ("a", "b")
    assert o.sort_keys == (SortKey("t", "descending"),)
    assert o.compacted_file_content_type is ContentType.ORC
    assert CompactOptions.from_mapping({"hash_buckets": "auto"}).hash_bucket_count is None
    assert CompactOptions(primary_keys=[]).primary_keys is None  # none given: the recorded keys
    with pytest.raises(FlashError, match="unknown option"):
        CompactOptions.from_mapping({"hash_bucket": 3})
