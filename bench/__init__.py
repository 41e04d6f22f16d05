"""Benchmarks that print figures, ratios against a baseline measured in the same run
(`gpuslice bench spawn|class|placement`, `python -m bench.report`): installed with
`pip install -e '.[bench]'`. Above everything else (docs/architecture.md): the runtime
never imports them.
"""
