"""Seed the store from the catalog files: validate, materialize model files, upsert."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from market.catalog import ModelEntry, Problem, load_images, load_models
from market.files import ModelFilesError, checksum, inside, make_read_only, size_of, unpack_package_model
from market.store import Image, Model, SeedReport, Store


@dataclass(frozen=True)
class SeedResult:
    report: SeedReport
    problems: tuple[Problem, ...]


def seed(store: Store, images_file: Path, models_file: Path, models_root: Path) -> SeedResult:
    images = load_images(images_file)
    models = load_models(models_file)
    problems = [*images.problems, *models.problems]
    records = []
    for number, entry in enumerate(models.models, start=1):
        try:
            records.append(_model_record(entry, models_root))
        except ModelFilesError as exc:
            problems.append(Problem(str(models_file), f"entry {number} ({entry.id})", "files", str(exc)))
    report = store.seed([Image.from_entry(e) for e in images.images], records)
    return SeedResult(report, tuple(problems))


def _model_record(entry: ModelEntry, root: Path) -> Model:
    root.mkdir(parents=True, exist_ok=True)
    if entry.package is not None:
        unpack_package_model(root, entry.id, entry.package)
        relative = entry.id
    else:
        assert entry.path is not None  # the schema asks for one of the two
        relative = entry.path
    folder = inside(root, relative)
    make_read_only(folder)
    digest = checksum(folder)
    if entry.checksum and entry.checksum != digest:
        raise ModelFilesError(f"the files' checksum is {digest}, the catalog says {entry.checksum}")
    return Model.from_entry(entry, relative, digest, size_of(folder))
