"""Dagster resources for the flash compactor (placeholder: a catalog and Ray cluster resource come later)."""
