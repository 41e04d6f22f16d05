"""Files from ../shared (the trace data and vendored third-party artifacts) for tests.

A user's clone has no ../shared: there, a test that needs one of its files skips with a
message naming the file. In CI (`CI=true`) the folder is always beside the checkout, so a
missing file fails the test instead of hiding it behind a skip.
"""

import os
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared"


def shared_file(relative: str) -> Path:
    """The path of `../shared/<relative>`, or skip (fail under CI=true) when it is missing."""
    path = SHARED / relative
    if not path.exists():
        message = f"needs {path} (the project's shared data and vendored artifacts, beside the checkout)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message + "; CI=true, so it must be there")
        pytest.skip(message)
    return path
