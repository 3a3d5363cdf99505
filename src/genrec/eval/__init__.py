"""Offline evaluation: protocols, metrics (field-standard definitions), baselines, reports."""
