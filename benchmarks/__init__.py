"""Reproducible performance runs (see README.md here)."""
