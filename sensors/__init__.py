"""Dagster sensors: the new-delta sensor (compaction triggers), the lake observation sensor (versions committed
elsewhere appear in the UI) and the SQS job-run dispatcher."""

from sensors.lake_observations import build_lake_observation_sensor
from sensors.new_deltas import build_new_delta_sensor, scan_table
from sensors.sqs_dispatch import build_sqs_dispatch_sensor, parse_instruction

__all__ = ["build_lake_observation_sensor", "build_new_delta_sensor", "build_sqs_dispatch_sensor", "parse_instruction", "scan_table"]
