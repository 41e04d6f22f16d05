"""Catalog files (images/catalog.yaml, images/models.yaml): pure parsing and validation.

Each entry is checked on its own against a pydantic schema; a bad entry becomes a
``Problem`` naming the file, the entry and the field, and is skipped, so one typo never
takes the rest of the market down.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sizes import SizeError, parse_quantity

SLUG = r"^[a-z0-9][a-z0-9-]{0,62}$"
Slug = Annotated[str, Field(pattern=SLUG, description="lower-case letters, digits and '-', 63 at most")]
Text = Annotated[str, Field(min_length=1, max_length=200)]
FRAMEWORKS = ("pytorch", "tensorflow", "jax", "python")
PLATFORM_ENV = "@platform"  # an image's local path meaning "the platform's own environment"


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: Slug
    name: Text
    version: Annotated[str, Field(min_length=1, max_length=40)]
    description: Annotated[str, Field(max_length=2000)] = ""
    size: str = "0"

    @field_validator("size")
    @classmethod
    def _size_is_a_quantity(cls, value: str) -> str:
        try:
            parse_quantity(str(value))
        except SizeError as exc:
            raise ValueError(str(exc)) from None
        return str(value)

    @property
    def size_bytes(self) -> int:
        return parse_quantity(self.size)


class ImageEntry(_Entry):
    framework: Literal["pytorch", "tensorflow", "jax", "python"]
    cuda: Annotated[str, Field(pattern=r"^\d+\.\d+$")] | None = None
    tags: list[Annotated[str, Field(max_length=40)]] = []
    contents: list[Annotated[str, Field(max_length=80)]] = []
    local: str | None = Field(None, description="Python environment prefix for the local backend, or @platform")
    container: str | None = Field(None, pattern=r"^[a-z0-9][a-z0-9._/:@-]*$", description="container image")
    dockerfile: str | None = Field(None, description="the Dockerfile under images/ that builds `container`")
    groups: list[str] = Field([], description="groups allowed to launch it (empty: everyone)")


class PackageFiles(BaseModel):
    """Model files that a PyPI package ships: the bytes of ``module.attribute``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    module: Annotated[str, Field(pattern=r"^[A-Za-z_][\w.]*$")]
    attribute: Annotated[str, Field(pattern=r"^[A-Za-z_]\w*$")]
    filename: Annotated[str, Field(pattern=r"^[\w][\w.-]*$")]


class ModelEntry(_Entry):
    task: Text
    framework: Text
    license: Text
    checksum: Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")] | None = None
    path: str | None = Field(None, description="folder relative to the models root")
    package: PackageFiles | None = None
    load: str = Field("", max_length=2000, description="Python that loads it; {path} is replaced")

    @field_validator("path")
    @classmethod
    def _path_stays_inside(cls, value: str | None) -> str | None:
        if value is not None:
            check_relative(value)
        return value

    @model_validator(mode="after")
    def _one_source(self) -> ModelEntry:
        if (self.path is None) == (self.package is None):
            raise ValueError("give exactly one of path (a folder under the models root) or package")
        return self


def check_relative(path: str) -> None:
    """A path under the models root: relative, no '..' (symlinks are checked where files are)."""
    parts = Path(path).parts
    if not path or Path(path).is_absolute() or ".." in parts or "\\" in path:
        raise ValueError(f"{path!r} must be a folder under the models root, without '..' or a leading '/'")


@dataclass(frozen=True)
class Problem:
    file: str
    entry: str  # "entry 3 (pytorch)"
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.entry}: {self.field}: {self.message}; the entry was skipped"


@dataclass(frozen=True)
class Catalog:
    images: tuple[ImageEntry, ...] = ()
    models: tuple[ModelEntry, ...] = ()
    problems: tuple[Problem, ...] = ()


def load_images(path: Path) -> Catalog:
    entries, problems = _load(path, "images", ImageEntry)
    return Catalog(images=tuple(entries), problems=tuple(problems))  # type: ignore[arg-type]


def load_models(path: Path) -> Catalog:
    entries, problems = _load(path, "models", ModelEntry)
    return Catalog(models=tuple(entries), problems=tuple(problems))  # type: ignore[arg-type]


def _load(path: Path, key: str, schema: type[_Entry]) -> tuple[list[_Entry], list[Problem]]:
    where = str(path)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        return [], [Problem(where, "the file", "-", f"cannot read it ({exc.strerror})")]
    except yaml.YAMLError as exc:
        return [], [Problem(where, "the file", "-", f"not valid YAML ({exc})")]
    items = raw.get(key) if isinstance(raw, dict) else None
    if not isinstance(items, list):
        return [], [Problem(where, "the file", key, f"the top level must hold a list under '{key}:'")]
    entries: list[_Entry] = []
    problems: list[Problem] = []
    seen: set[str] = set()
    for number, item in enumerate(items, start=1):
        label = f"entry {number}" + (f" ({item['id']})" if isinstance(item, dict) and "id" in item else "")
        if not isinstance(item, dict):
            problems.append(Problem(where, label, "-", "must be a mapping of fields"))
            continue
        try:
            entry = schema.model_validate(item)
        except ValidationError as exc:
            problems.extend(_problems(where, label, exc))
            continue
        if entry.id in seen:
            problems.append(Problem(where, label, "id", f"{entry.id!r} appears twice; ids must be unique"))
            continue
        seen.add(entry.id)
        entries.append(entry)
    return entries, problems


def _problems(where: str, label: str, exc: ValidationError) -> list[Problem]:
    return [
        Problem(
            where, label, ".".join(str(p) for p in error["loc"]) or "-", str(error["msg"]).removeprefix("Value error, ")
        )
        for error in exc.errors()
    ]
