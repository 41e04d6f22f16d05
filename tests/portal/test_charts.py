"""The figure builders are safe to call from Streamlit's session threads."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.process  # starts processes: not in the fast tier


def test_importing_the_charts_imports_pandas_in_full_before_any_figure() -> None:
    # Plotly reads sys.modules["pandas"] without importing it: if another session's thread is
    # importing pandas at that moment, Plotly gets a half-initialized module and the page fails.
    # Once portal.charts is imported, pandas must already be complete.
    code = "import sys, portal.charts; p = sys.modules.get('pandas'); print(bool(p and hasattr(p, 'Series')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True", out.stderr
