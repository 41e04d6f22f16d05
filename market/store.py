"""The market store: images, models and their revision history in SQLAlchemy.

SQLite file by default (``sqlite:///data/market.sqlite``), any SQLAlchemy URL in
production. The schema is owned by Alembic (``migrate``). Every write is one
transaction: it either lands whole or not at all (a locked or read-only database
raises ``MarketError`` and leaves nothing half-written). Authorization is not checked
here: callers (portal/data/markets.py, the spawner) decide who may do what.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import JSON, Boolean, Float, Integer, String, Text, create_engine, event, select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from market.catalog import ImageEntry, ModelEntry

if TYPE_CHECKING:  # Alembic is imported where the schema is checked or migrated: ~0.5 s of CPU at every
    from alembic.config import Config  # start of a process that only reads the market (the hub's services)

MIGRATIONS = Path(__file__).parent / "migrations"
IMAGE_STATUSES = ("active", "deprecated")
MODEL_STATUSES = ("pending", "approved", "rejected")


class MarketError(RuntimeError):
    """The market database could not be read or written; nothing was changed."""


class Base(DeclarativeBase):
    pass


class ImageRow(Base):
    __tablename__ = "image"
    slug: Mapped[str] = mapped_column(String(63), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    version: Mapped[str] = mapped_column(String(40))
    description: Mapped[str] = mapped_column(Text, default="")
    framework: Mapped[str] = mapped_column(String(20))
    cuda: Mapped[str | None] = mapped_column(String(10), nullable=True)
    size_bytes: Mapped[int] = mapped_column(Integer, default=0)
    tags: Mapped[list[str]] = mapped_column(JSON, default=list)
    contents: Mapped[list[str]] = mapped_column(JSON, default=list)
    local_path: Mapped[str | None] = mapped_column(Text, nullable=True)
    container: Mapped[str | None] = mapped_column(Text, nullable=True)
    groups: Mapped[list[str]] = mapped_column(JSON, default=list)
    status: Mapped[str] = mapped_column(String(20), default="active")
    origin: Mapped[str] = mapped_column(String(20))  # "catalog" or "admin"
    edited: Mapped[bool] = mapped_column(Boolean, default=False)  # an admin changed it: seeding leaves it
    updated: Mapped[float] = mapped_column(Float)


class ModelRow(Base):
    __tablename__ = "model"
    slug: Mapped[str] = mapped_column(String(63), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    version: Mapped[str] = mapped_column(String(40))
    description: Mapped[str] = mapped_column(Text, default="")
    task: Mapped[str] = mapped_column(String(200))
    framework: Mapped[str] = mapped_column(String(200))
    license: Mapped[str] = mapped_column(String(200))
    size_bytes: Mapped[int] = mapped_column(Integer, default=0)
    checksum: Mapped[str | None] = mapped_column(String(80), nullable=True)
    path: Mapped[str] = mapped_column(Text)  # relative to the models root
    load: Mapped[str] = mapped_column(Text, default="")
    status: Mapped[str] = mapped_column(String(20))
    origin: Mapped[str] = mapped_column(String(20))
    edited: Mapped[bool] = mapped_column(Boolean, default=False)
    proposed_by: Mapped[str | None] = mapped_column(String(255), nullable=True)
    reviewed_by: Mapped[str | None] = mapped_column(String(255), nullable=True)
    review_note: Mapped[str] = mapped_column(Text, default="")
    created: Mapped[float] = mapped_column(Float)
    updated: Mapped[float] = mapped_column(Float)


class RevisionRow(Base):
    __tablename__ = "revision"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(10), index=True)  # "image" or "model"
    slug: Mapped[str] = mapped_column(String(63), index=True)
    version: Mapped[str] = mapped_column(String(40))
    action: Mapped[str] = mapped_column(String(20))
    actor: Mapped[str] = mapped_column(String(255), index=True)
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    at: Mapped[float] = mapped_column(Float, index=True)


class SelectionRow(Base):
    """Models a user chose with "Use in notebook": mounted into their next server."""

    __tablename__ = "model_selection"
    user: Mapped[str] = mapped_column(String(255), primary_key=True)
    slug: Mapped[str] = mapped_column(String(63), primary_key=True)
    at: Mapped[float] = mapped_column(Float)


# -- plain records handed to callers (picklable, safe to cache) -----------------------


@dataclass(frozen=True)
class Image:
    slug: str
    name: str
    version: str
    framework: str
    description: str = ""
    cuda: str | None = None
    size_bytes: int = 0
    tags: tuple[str, ...] = ()
    contents: tuple[str, ...] = ()
    local_path: str | None = None
    container: str | None = None
    groups: tuple[str, ...] = ()
    status: str = "active"
    origin: str = "admin"

    @classmethod
    def from_entry(cls, entry: ImageEntry) -> Image:
        return cls(
            slug=entry.id,
            name=entry.name,
            version=entry.version,
            framework=entry.framework,
            description=entry.description,
            cuda=entry.cuda,
            size_bytes=entry.size_bytes,
            tags=tuple(entry.tags),
            contents=tuple(entry.contents),
            local_path=entry.local,
            container=entry.container,
            groups=tuple(entry.groups),
            origin="catalog",
        )


@dataclass(frozen=True)
class Model:
    slug: str
    name: str
    version: str
    task: str
    framework: str
    license: str
    path: str
    description: str = ""
    size_bytes: int = 0
    checksum: str | None = None
    load: str = ""
    status: str = "approved"
    origin: str = "admin"
    proposed_by: str | None = None
    reviewed_by: str | None = None
    review_note: str = ""
    created: float = field(default=0.0, compare=False)

    @classmethod
    def from_entry(cls, entry: ModelEntry, path: str, checksum: str | None, size_bytes: int) -> Model:
        return cls(
            slug=entry.id,
            name=entry.name,
            version=entry.version,
            task=entry.task,
            framework=entry.framework,
            license=entry.license,
            path=path,
            description=entry.description,
            size_bytes=size_bytes or entry.size_bytes,
            checksum=checksum,
            load=entry.load,
            origin="catalog",
        )


@dataclass(frozen=True)
class Revision:
    kind: str
    slug: str
    version: str
    action: str
    actor: str
    at: float


@dataclass(frozen=True)
class SeedReport:
    added: tuple[str, ...] = ()
    updated: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()  # changed by an admin (or not from the catalog), left as they are
    unchanged: tuple[str, ...] = ()


_IMAGE_FIELDS = tuple(f for f in Image.__dataclass_fields__)
_MODEL_FIELDS = tuple(f for f in Model.__dataclass_fields__)
_LISTS = {"tags", "contents", "groups"}


def _image(row: ImageRow) -> Image:
    values: dict[str, Any] = {f: getattr(row, f) for f in _IMAGE_FIELDS}
    return Image(**values | {f: tuple(values[f]) for f in _LISTS})


def _model(row: ModelRow) -> Model:
    return Model(**{f: getattr(row, f) for f in _MODEL_FIELDS})


def _columns(record: Image | Model) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(record).items()}


class Store:
    def __init__(self, url: str, *, engine: Engine | None = None) -> None:
        self.url = url
        self.engine = engine or _engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    # -- schema -------------------------------------------------------------------------

    def _alembic(self) -> Config:
        from alembic.config import Config

        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        config.attributes["engine"] = self.engine
        return config

    def at_newest(self) -> bool:
        """Whether the schema is at the newest Alembic revision (``gpuslice upgrade`` asks before migrating)."""
        from alembic.runtime.migration import MigrationContext
        from alembic.script import ScriptDirectory

        head = ScriptDirectory.from_config(self._alembic()).get_current_head()
        try:
            with self.engine.connect() as connection:
                return MigrationContext.configure(connection).get_current_revision() == head
        except SQLAlchemyError as exc:
            raise MarketError(f"the market database {self._where()} could not be read: {_short(exc)}") from exc

    def migrate(self) -> None:
        """Bring the schema to the newest Alembic revision (creates it on a new database)."""
        from alembic import command

        try:
            command.upgrade(self._alembic(), "head")
        except SQLAlchemyError as exc:
            raise MarketError(f"the market database {self._where()} could not be migrated: {_short(exc)}") from exc

    # -- transactions -------------------------------------------------------------------

    @contextmanager
    def _session(self, writing: bool = False) -> Iterator[Session]:
        what = "written" if writing else "read"
        try:
            with self._sessions.begin() as session:
                yield session
        except SQLAlchemyError as exc:
            raise MarketError(
                f"the market database {self._where()} could not be {what}: {_short(exc)}; nothing was changed"
            ) from exc

    def _where(self) -> str:
        return self.engine.url.render_as_string(hide_password=True)

    def _revise(self, session: Session, kind: str, record: Image | Model, action: str, actor: str) -> None:
        session.add(
            RevisionRow(
                kind=kind,
                slug=record.slug,
                version=record.version,
                action=action,
                actor=actor,
                data=_columns(record),
                at=time.time(),
            )
        )

    # -- images -------------------------------------------------------------------------

    def images(self, *, include_deprecated: bool = True) -> list[Image]:
        with self._session() as session:
            query = select(ImageRow).order_by(ImageRow.name)
            if not include_deprecated:
                query = query.where(ImageRow.status == "active")
            return [_image(r) for r in session.scalars(query)]

    def image(self, slug: str) -> Image | None:
        with self._session() as session:
            row = session.get(ImageRow, slug)
            return None if row is None else _image(row)

    def save_image(self, image: Image, actor: str) -> str:
        """Publish a new image or edit one (an admin's change: seeding will not undo it)."""
        with self._session(writing=True) as session:
            row = session.get(ImageRow, image.slug)
            action = "edited" if row else "published"
            if row is None:
                row = ImageRow(slug=image.slug, origin="admin")
                session.add(row)
            for key, value in _columns(image).items():
                if key not in ("slug", "origin"):
                    setattr(row, key, value)
            row.edited, row.updated = True, time.time()
            self._revise(session, "image", image, action, actor)
            return action

    def set_image_status(self, slug: str, status: str, actor: str) -> Image:
        if status not in IMAGE_STATUSES:
            raise ValueError(f"image status must be one of {', '.join(IMAGE_STATUSES)}, not {status!r}")
        with self._session(writing=True) as session:
            row = session.get(ImageRow, slug)
            if row is None:
                raise KeyError(f"no image {slug!r} in the market")
            row.status, row.edited, row.updated = status, True, time.time()
            image = _image(row)
            self._revise(session, "image", image, "deprecated" if status == "deprecated" else "restored", actor)
            return image

    # -- models -------------------------------------------------------------------------

    def models(self, statuses: Iterable[str] = MODEL_STATUSES) -> list[Model]:
        with self._session() as session:
            query = select(ModelRow).where(ModelRow.status.in_(list(statuses))).order_by(ModelRow.name)
            return [_model(r) for r in session.scalars(query)]

    def model(self, slug: str) -> Model | None:
        with self._session() as session:
            row = session.get(ModelRow, slug)
            return None if row is None else _model(row)

    def propose_model(self, model: Model, actor: str) -> Model:
        """A new entry, pending review. KeyError if the id is taken."""
        with self._session(writing=True) as session:
            if session.get(ModelRow, model.slug) is not None:
                raise KeyError(f"a model with id {model.slug!r} exists already; choose another id")
            now = time.time()
            proposed = replace(model, status="pending", origin="proposal", proposed_by=actor)
            session.add(ModelRow(**_columns(proposed) | {"created": now, "updated": now}))
            self._revise(session, "model", proposed, "proposed", actor)
            return proposed

    def review_model(self, slug: str, approve: bool, actor: str, note: str = "") -> Model:
        with self._session(writing=True) as session:
            row = session.get(ModelRow, slug)
            if row is None:
                raise KeyError(f"no model {slug!r} in the market")
            row.status = "approved" if approve else "rejected"
            row.reviewed_by, row.review_note, row.edited, row.updated = actor, note, True, time.time()
            model = _model(row)
            self._revise(session, "model", model, row.status, actor)
            return model

    def proposals_since(self, actor: str, since: float) -> int:
        with self._session() as session:
            query = select(RevisionRow).where(
                RevisionRow.actor == actor, RevisionRow.action == "proposed", RevisionRow.at >= since
            )
            return len(list(session.scalars(query)))

    # -- selections ("Use in notebook") -------------------------------------------------

    def select_model(self, user: str, slug: str, chosen: bool) -> None:
        with self._session(writing=True) as session:
            row = session.get(SelectionRow, (user, slug))
            if chosen and row is None:
                session.add(SelectionRow(user=user, slug=slug, at=time.time()))
            elif not chosen and row is not None:
                session.delete(row)

    def selected_models(self, user: str) -> list[str]:
        with self._session() as session:
            query = select(SelectionRow.slug).where(SelectionRow.user == user).order_by(SelectionRow.at)
            return list(session.scalars(query))

    # -- history and seeding ------------------------------------------------------------

    def history(self, kind: str, slug: str) -> list[Revision]:
        with self._session() as session:
            query = select(RevisionRow).where(RevisionRow.kind == kind, RevisionRow.slug == slug)
            rows = session.scalars(query.order_by(RevisionRow.id))
            return [Revision(r.kind, r.slug, r.version, r.action, r.actor, r.at) for r in rows]

    def seed(self, images: Iterable[Image], models: Iterable[Model]) -> SeedReport:
        """Add catalog entries; update those no admin changed; never delete or undo an admin."""
        outcomes: dict[str, list[str]] = {"added": [], "updated": [], "kept": [], "unchanged": []}
        with self._session(writing=True) as session:
            for image in images:
                outcome = self._seed_one(session, "image", ImageRow, image)
                outcomes[outcome].append(f"image {image.slug}")
            for model in models:
                outcome = self._seed_one(session, "model", ModelRow, model)
                outcomes[outcome].append(f"model {model.slug}")
        return SeedReport(**{k: tuple(v) for k, v in outcomes.items()})

    def _seed_one(
        self, session: Session, kind: str, table: type[ImageRow] | type[ModelRow], record: Image | Model
    ) -> str:
        row: ImageRow | ModelRow | None = session.get(table, record.slug)  # type: ignore[assignment]
        now = time.time()
        columns = _columns(record)
        if row is None:
            extra = {"created": now} if table is ModelRow else {}
            session.add(table(**columns | extra | {"updated": now}))
            self._revise(session, kind, record, "seeded", "catalog")
            return "added"
        if row.edited or row.origin != "catalog":
            return "kept"
        changes = {k: v for k, v in columns.items() if k not in ("status", "created") and getattr(row, k) != v}
        if not changes:
            return "unchanged"
        for key, value in changes.items():
            setattr(row, key, value)
        row.updated = now
        self._revise(session, kind, record, "seeded", "catalog")
        return "updated"


def _engine(url: str) -> Engine:
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 15})

        @event.listens_for(engine, "connect")
        def _pragmas(connection: Any, _record: Any) -> None:
            cursor = connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        return engine
    return create_engine(url, pool_pre_ping=True)


def _short(exc: SQLAlchemyError) -> str:
    return str(getattr(exc, "orig", None) or exc).splitlines()[0]


_STORES: dict[str, Store] = {}


def market_store(url: str) -> Store:
    """One Store (engine and pool) per URL per process."""
    if url not in _STORES:
        _STORES[url] = Store(url)
    return _STORES[url]
