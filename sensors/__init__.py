"""Dagster sensors for the flash compactor (placeholder: a new-delta sensor that triggers compaction comes later)."""
