"""Canonical tables (events, items, feedviews), ingestors, the bucketed Iceberg store and the in-trainer join."""
