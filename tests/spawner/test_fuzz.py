"""Property-based fuzzing of what users and admins type: never a crash, never a leftover allocation."""

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hub.settings import SettingsError, from_mapping
from market.catalog import load_images, load_models
from spawner.ledger import Ledger
from spawner.lifecycle import LedgerGpuMixin
from spawner.request import GpuRefused

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["4GiB", "0.5", "0", "1", "16GiB", "512Mi", "-1", "1e309", "nan", "default", "langid-97", ""]),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
option_keys = st.sampled_from(["gpu_memory", "gpus", "image", "models", "profile", "x"])
user_options = st.one_of(values, st.dictionaries(option_keys, values, max_size=4))


class FuzzSpawner(LedgerGpuMixin):
    """The mixin with just enough of JupyterHub's Spawner around it."""

    def __init__(self, ledger: Path, options: Any) -> None:
        super().__init__(gpu_simulate="2x16GiB:T4", gpu_ledger_path=str(ledger))
        self.user = SimpleNamespace(name="fuzz", groups=[SimpleNamespace(name="ml101")], admin=False)
        self.name = ""
        self.user_options = options
        self.log = logging.getLogger("fuzz")
        self.gpu_groups = [{"name": "ml101", "max_slice": "8GiB", "budget": "24GiB"}]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(options=user_options)
def test_any_user_options_are_placed_or_refused_cleanly(tmp_path: Path, options: Any) -> None:
    ledger = tmp_path / "ledger.sqlite"
    spawner = FuzzSpawner(ledger, options)
    try:
        _, holds = spawner.allocate()
    except GpuRefused as refusal:
        assert refusal.status_code in (400, 403, 409)
        assert refusal.jupyterhub_message and "Traceback" not in refusal.jupyterhub_message
        assert [h for h in Ledger(ledger).holdings() if h.key == "fuzz/"] == []  # nothing left behind
    else:
        rows = Ledger(ledger).holdings()
        assert sum(h.memory_bytes for h in rows) <= 24 * 2**30  # the group budget
        assert all(h.memory_bytes <= 16 * 2**30 for h in rows)
        assert len(rows) == len(holds)
    Ledger(ledger).release("fuzz/")


def test_the_harness_can_allocate_and_refuse(tmp_path: Path) -> None:
    """The fuzz above would pass vacuously if every spawn were refused: check both outcomes happen."""
    ledger = tmp_path / "ledger.sqlite"
    _, holds = FuzzSpawner(ledger, {"gpu_memory": "4GiB"}).allocate()
    assert [h.memory_bytes for h in holds] == [4 * 2**30]
    try:
        FuzzSpawner(ledger, {"gpu_memory": "12GiB"}).allocate()
    except GpuRefused as refusal:
        assert refusal.status_code == 403 and "allows slices up to 8 GiB" in refusal.jupyterhub_message
    else:
        raise AssertionError("a 12 GiB slice passed an 8 GiB group limit")


settings_values = st.dictionaries(
    st.sampled_from(
        [
            "port",
            "data_dir",
            "admin_users",
            "gpus",
            "groups",
            "images",
            "isolation",
            "idle_timeout",
            "open_signup",
            "monitoring",
            "market",
            "hub_port",
            "portal_port",
            "streamlit_port",
            "other",
        ]
    ),
    values,
    max_size=5,
)


@settings(max_examples=300, deadline=None)
@given(raw=settings_values)
def test_any_settings_load_or_name_the_bad_key(raw: dict[str, Any]) -> None:
    try:
        from_mapping(raw, "fuzz.yaml")
    except SettingsError as exc:
        assert str(exc).startswith("fuzz.yaml")


entry_fields = st.dictionaries(
    st.sampled_from(
        [
            "id",
            "name",
            "version",
            "framework",
            "cuda",
            "size",
            "tags",
            "local",
            "container",
            "groups",
            "task",
            "license",
            "path",
            "package",
            "checksum",
            "load",
            "description",
        ]
    ),
    values,
    max_size=8,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=st.one_of(values, st.lists(st.one_of(entry_fields, values), max_size=4)))
def test_any_catalog_file_loads_what_is_valid_and_reports_the_rest(tmp_path: Path, entries: Any) -> None:
    for key, load in (("images", load_images), ("models", load_models)):
        path = tmp_path / f"{key}.yaml"
        path.write_text(yaml.safe_dump({key: entries}))
        catalog = load(path)
        loaded = len(catalog.images) + len(catalog.models)
        assert loaded + len({p.entry for p in catalog.problems}) >= (len(entries) if isinstance(entries, list) else 0)
        for problem in catalog.problems:
            assert str(problem).startswith(str(path))
