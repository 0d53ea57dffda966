"""Attempt data: schema, validated ingest and the embedded DuckDB store."""
