"""Suite-wide setup that must happen before any test module is imported."""

import json
import os
import tempfile
from pathlib import Path

# KubeSpawner needs a kubeconfig even when it makes no API call, and kubernetes_asyncio
# reads $KUBECONFIG once, when it is first imported. Tests that talk to the Kubernetes
# API double write their own and hand it to the hub's environment.
if "KUBECONFIG" not in os.environ:
    _path = Path(tempfile.mkdtemp(prefix="gpuslice-kube-")) / "kubeconfig"
    _path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "none", "cluster": {"server": "http://127.0.0.1:1"}}],
                "users": [{"name": "none", "user": {"token": "unused"}}],
                "contexts": [{"name": "none", "context": {"cluster": "none", "user": "none", "namespace": "gpuslice"}}],
                "current-context": "none",
            }
        )
    )
    os.environ["KUBECONFIG"] = str(_path)

SHARED = Path(__file__).parents[1].parent / "shared"


def shared_path(relative: str) -> Path:
    """A file under ../shared (data, vendor): skipped with its name when missing, a failure with CI=true."""
    import pytest

    path = SHARED / relative
    if not path.exists():
        message = f"{path} is missing (../shared/{relative}; see ../shared/vendor/README.md)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path
