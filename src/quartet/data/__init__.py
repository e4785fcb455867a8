"""Datasets and built-in synthetic tasks (generated, verifiable, no download)."""
