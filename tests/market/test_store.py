"""The market store on real SQLite files: migrations, seeding, reviews, failures."""

import os
import sqlite3
import time
from dataclasses import replace
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from market import seeding
from market.store import Base, Image, MarketError, Model, Store
from portal.views import load_code

REPO = Path(__file__).parents[2]
IMAGES = REPO / "images" / "catalog.yaml"
MODELS = REPO / "images" / "models.yaml"


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store(f"sqlite:///{tmp_path / 'market.sqlite'}")
    store.migrate()
    return store


def test_the_migration_builds_exactly_the_models_schema(store: Store) -> None:
    with store.engine.connect() as connection:
        assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
    store.migrate()  # again: nothing to do, no error


def test_seeding_is_idempotent_and_never_undoes_an_admin(store: Store, tmp_path: Path) -> None:
    first = seeding.seed(store, IMAGES, MODELS, tmp_path / "models")
    assert first.problems == ()
    assert "image pytorch" in first.report.added and "model langid-97" in first.report.added
    again = seeding.seed(store, IMAGES, MODELS, tmp_path / "models")
    assert again.report.added == () and again.report.updated == ()

    pytorch = store.image("pytorch")
    assert pytorch is not None
    store.save_image(replace(pytorch, description="Our tuned build"), actor="root")
    store.set_image_status("jax", "deprecated", actor="root")
    mine = Image(slug="rapids", name="RAPIDS", version="24.10", framework="python", cuda="12.4")
    assert store.save_image(mine, actor="root") == "published"

    third = seeding.seed(store, IMAGES, MODELS, tmp_path / "models")
    assert set(third.report.kept) == {"image pytorch", "image jax"}
    assert store.image("pytorch").description == "Our tuned build"  # type: ignore[union-attr]
    assert store.image("jax").status == "deprecated"  # type: ignore[union-attr]
    assert store.image("rapids") is not None  # not in the catalog, not dropped
    assert "jax" not in [i.slug for i in store.images(include_deprecated=False)]
    assert [r.action for r in store.history("image", "pytorch")] == ["seeded", "edited"]


def test_a_catalog_change_updates_an_untouched_entry(store: Store, tmp_path: Path) -> None:
    seeding.seed(store, IMAGES, MODELS, tmp_path / "models")
    changed = tmp_path / "catalog.yaml"
    changed.write_text(IMAGES.read_text().replace("PyTorch, torchvision and torchaudio", "PyTorch and friends"))
    result = seeding.seed(store, changed, MODELS, tmp_path / "models")
    assert result.report.updated == ("image pytorch",)
    assert store.image("pytorch").description.startswith("PyTorch and friends")  # type: ignore[union-attr]


def test_the_demo_model_is_real_and_loads_from_its_files(store: Store, tmp_path: Path) -> None:
    seeding.seed(store, IMAGES, MODELS, tmp_path / "models")
    model = store.model("langid-97")
    assert model is not None and model.status == "approved" and model.checksum
    folder = tmp_path / "models" / model.path
    assert oct(folder.stat().st_mode & 0o777) == "0o555"
    namespace: dict[str, object] = {}
    os.environ["GPUSLICE_MODELS_DIR"] = str(folder.parent)
    try:
        exec(load_code(model), namespace)  # the code the portal shows, as a notebook runs it
    finally:
        del os.environ["GPUSLICE_MODELS_DIR"]
    assert namespace["identifier"].classify("Das ist ein kleiner Test")[0] == "de"  # type: ignore[attr-defined]


def test_bad_model_files_are_problems_not_crashes(store: Store, tmp_path: Path) -> None:
    root = tmp_path / "models"
    (root / "real").mkdir(parents=True)
    (root / "real" / "w.bin").write_bytes(b"weights")
    outside = tmp_path / "secret"
    outside.mkdir()
    (root / "escape").symlink_to(outside)
    catalog = tmp_path / "models.yaml"
    common = 'name: M, version: "1", task: t, framework: f, license: MIT'
    catalog.write_text(
        f"""
models:
  - {{id: real, {common}, path: real}}
  - {{id: escape, {common}, path: escape}}
  - {{id: missing, {common}, path: nowhere}}
  - {{id: tampered, {common}, path: real, checksum: "sha256:{"0" * 64}"}}
"""
    )
    result = seeding.seed(store, IMAGES, catalog, root)
    assert [m.slug for m in store.models()] == ["real"]
    messages = {p.entry: p.message for p in result.problems}
    assert "outside the models root" in messages["entry 2 (escape)"]
    assert "is not a folder" in messages["entry 3 (missing)"]
    assert "checksum" in messages["entry 4 (tampered)"]


def test_proposals_reviews_and_selections(store: Store) -> None:
    proposal = Model("bert-tiny", "BERT tiny", "1", "fill-mask", "pytorch", "Apache-2.0", "team/bert-tiny")
    saved = store.propose_model(proposal, actor="ann")
    assert (saved.status, saved.proposed_by) == ("pending", "ann")
    with pytest.raises(KeyError, match="exists already"):
        store.propose_model(proposal, actor="bob")
    assert store.proposals_since("ann", time.time() - 60) == 1
    assert store.models(["approved"]) == []
    reviewed = store.review_model("bert-tiny", approve=False, actor="root", note="license unclear")
    assert (reviewed.status, reviewed.reviewed_by, reviewed.review_note) == ("rejected", "root", "license unclear")
    store.select_model("ann", "bert-tiny", True)
    store.select_model("ann", "bert-tiny", True)
    assert store.selected_models("ann") == ["bert-tiny"]
    store.select_model("ann", "bert-tiny", False)
    assert store.selected_models("ann") == []


def test_a_locked_database_fails_clearly_and_writes_nothing(store: Store, tmp_path: Path) -> None:
    locker = sqlite3.connect(tmp_path / "market.sqlite", isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        quick = Store(store.url, engine=_engine_with_timeout(store.url, 0.2))
        with pytest.raises(MarketError, match="could not be written: database is locked; nothing was changed"):
            quick.save_image(Image("x", "X", "1", "python"), actor="root")
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    assert store.image("x") is None and store.history("image", "x") == []


def test_a_read_only_database_fails_clearly(store: Store, tmp_path: Path) -> None:
    if os.geteuid() == 0:
        # root ignores file modes: open the file read-only through SQLite's URI instead.
        url = f"sqlite:///file:{tmp_path / 'market.sqlite'}?mode=ro&uri=true"
    else:
        (tmp_path / "market.sqlite").chmod(0o444)
        url = store.url
    read_only = Store(url, engine=_engine_with_timeout(url, 1))
    with pytest.raises(MarketError, match="could not be"):
        read_only.save_image(Image("x", "X", "1", "python"), actor="root")
    assert store.image("x") is None


def _engine_with_timeout(url: str, seconds: float):  # type: ignore[no-untyped-def]
    from sqlalchemy import create_engine

    return create_engine(url, connect_args={"timeout": seconds})
