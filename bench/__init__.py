"""Benchmarks (run as scripts: python bench/NAME.py)."""
