"""spawner/lab/gpuslice_lab_jobs.py's body for the jobs API (on a real platform: tests/e2e/test_jobs.py)."""

import importlib.util
from types import ModuleType

from spawner.assets import LAB_DIR
from spawner.jobs import JobSpec


def lab_jobs_module() -> ModuleType:
    """The extension as the notebook server loads it: a module beside its config, not one of our packages."""
    spec = importlib.util.spec_from_file_location("gpuslice_lab_jobs", LAB_DIR / "gpuslice_lab_jobs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lab = lab_jobs_module()


def test_a_notebook_deep_in_folders_gets_a_name_the_jobs_api_takes_ending_with_its_file() -> None:
    path = "courses/" + "very-long-folder-name/" * 6 + "train.ipynb"
    body = lab.job_spec({"path": path, "gpu_memory": "4GiB"})
    name = body["name"]
    assert len(name) == 80 and name.startswith("Run as job: …") and name.endswith("-folder-name/train.ipynb")
    assert JobSpec.model_validate(body).name == name  # refused before: the API allows 80 characters
    assert lab.job_spec({"path": "work/train.ipynb"})["name"] == "Run as job: work/train.ipynb"
