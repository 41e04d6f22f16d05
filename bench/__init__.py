"""Benchmarks that print figures (`gpuslice bench spawn|class`): installed with `pip install -e '.[bench]'`.

Above everything else (docs/architecture.md): the runtime never imports them.
The placement replay (`gpuslice bench placement`) is spawner/simulate.py.
"""
