"""Started by Python in every process of a gpuslice notebook server (kernels, terminals).

The spawner puts this folder, and nothing else, on PYTHONPATH; see gpuslice_limits.
"""

import sys


def _hide_the_platform() -> None:
    """Drop the platform's editable-install finder: notebooks must not import our packages.

    The default image is the platform's own Python environment, where ``pip install -e``
    left a finder that maps ``hub``, ``spawner``, ``portal``, ``market`` and ``bench`` to
    the platform's source tree; without this a notebook's ``import hub`` would find ours.
    """
    sys.meta_path[:] = [
        finder
        for finder in sys.meta_path
        if not str(getattr(finder, "__module__", "")).startswith("__editable___gpuslice")
    ]


try:
    _hide_the_platform()
    import gpuslice_limits

    gpuslice_limits.install()
except Exception:  # a broken hook must never stop Python from starting
    pass
