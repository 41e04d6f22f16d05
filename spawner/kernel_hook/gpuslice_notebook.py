"""Run a notebook headless for a gpuslice job, and save the executed copy beside it.

    python -m gpuslice_notebook NOTEBOOK OUTPUT

Started by the job runner in the job's environment (the image's Python, this folder on
PYTHONPATH, the slice's limits), as the job's owner. Every cell runs in order with nbclient in
the notebook's own kernel; the executed notebook, outputs included, is written to OUTPUT
(train.job-12.ipynb beside train.ipynb) even when a cell fails, so the owner sees how far it
got. Exit status: 0 when every cell ran, 1 when one raised (its error is printed to the
job's log), 2 when the notebook could not be read. Standalone: only nbclient and nbformat,
which every JupyterLab environment has.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m gpuslice_notebook NOTEBOOK OUTPUT", file=sys.stderr)
        return 2
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    source, output = Path(argv[0]), Path(argv[1])
    try:
        notebook = nbformat.read(source, as_version=4)  # type: ignore[no-untyped-call]
    except (OSError, ValueError) as exc:
        print(f"gpuslice: cannot read the notebook {source}: {exc}", file=sys.stderr)
        return 2
    print(f"gpuslice: running {source} ({len(notebook.cells)} cells); the executed copy goes to {output}", flush=True)
    client = NotebookClient(notebook, timeout=None, resources={"metadata": {"path": str(source.parent)}})
    status = 0
    try:
        client.execute()
    except CellExecutionError as exc:
        print(f"gpuslice: a cell failed:\n{exc}", file=sys.stderr, flush=True)
        status = 1
    finally:
        nbformat.write(notebook, output)  # type: ignore[no-untyped-call]
    print(f"gpuslice: saved the executed notebook to {output}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
