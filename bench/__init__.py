"""Benchmarks: they print figures (ratios against a baseline measured in the same run)."""
