"""The GPU line's timeouts: every deployment's defaults (hub/settings.py) and the line's own (waitline.py).

Apart from spawner/waitline.py, which needs numpy (through the placement), so that reading the
settings, which every service and every `gpuslice` command does at its start, does not import it.
"""

# While anyone waits: seconds a GPU server may be idle before its slice is reclaimed (the
# settings' gpu_idle_timeout; every deployment's default comes from here), and the longest
# a request may wait in the line (line_max_wait).
GPU_IDLE_TIMEOUT_S = 900
LINE_MAX_WAIT_S = 4 * 3600

# While anyone waits, a slice goes to the line once its owner has *left*, with nothing of the server
# used (kernels, GPU, input in a page): GPU_LEFT_TIMEOUT_S after the last JupyterLab page of it closed
# (a closed tab, a laptop asleep), or GPU_NO_INPUT_TIMEOUT_S after the last input in a page still open
# (a screen left on, or a student away from the page); GPU_RELEASE_TIMEOUT_S after they left it is
# released also when nobody waits (the settings' gpu_left_timeout, gpu_no_input_timeout and
# gpu_release_timeout; every deployment's defaults come from here, chosen on the class-day
# benchmark's design seeds: docs/load.md).
GPU_LEFT_TIMEOUT_S = 120
GPU_NO_INPUT_TIMEOUT_S = 480
GPU_RELEASE_TIMEOUT_S = 600
