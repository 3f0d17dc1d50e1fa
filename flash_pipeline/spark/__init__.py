"""PySpark loads into the delta catalog (no Dagster imports here): the demo order-status event generator."""
