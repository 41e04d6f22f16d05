"""Started by Python in every process of a gpuslice notebook server (kernels, terminals).

The spawner puts this folder first on PYTHONPATH; see gpuslice_limits.
"""

try:
    import gpuslice_limits

    gpuslice_limits.install()
except Exception:  # a broken hook must never stop Python from starting
    pass
