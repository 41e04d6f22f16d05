"""The sharing backends: one module each, registered in one table.

Each module holds everything one way of sharing GPUs knows (its pod resources,
annotations and environment; its inventory parser; its extender specifics; its words for
the spawn form) behind the one interface of ``spawner/sharing/base.py``. Adding a backend
is a module with a ``SharingBackend`` subclass and one line in ``BACKENDS`` (or one call of
``register``, as tests/spawner/sharing/fake.py does).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import fields
from datetime import datetime
from typing import Any

from spawner.inventory import Inventory
from spawner.sharing.base import Listing, Obj, SharingBackend
from spawner.sharing.dra import Dra
from spawner.sharing.gpushare import Gpushare
from spawner.sharing.hami import Hami
from spawner.sharing.kai import Kai
from spawner.sharing.local import Local
from spawner.sharing.mig import Mig
from spawner.sharing.timeslicing import Timeslicing
from spawner.sharing.whole import Whole

BACKENDS: dict[str, type[SharingBackend]] = {
    cls.name: cls for cls in (Gpushare, Hami, Timeslicing, Mig, Whole, Dra, Kai, Local)
}


class UnknownBackendError(ValueError):
    """A backend name or setting nobody registered; the message lists the known ones."""


def register(cls: type[SharingBackend]) -> type[SharingBackend]:
    """Add a backend to the table (usable as a class decorator); its ``name`` must be new."""
    if cls.name in BACKENDS and BACKENDS[cls.name] is not cls:
        raise ValueError(f"a sharing backend named {cls.name!r} is registered already")
    BACKENDS[cls.name] = cls
    return cls


def names(*, kubernetes: bool | None = None, extender: bool | None = None) -> list[str]:
    """The registered backends' names, optionally only those for Kubernetes or for the extender."""
    return [
        name
        for name, cls in BACKENDS.items()
        if (kubernetes is None or cls.kubernetes == kubernetes) and (extender is None or cls.extender == extender)
    ]


def backend(name: str, **settings: Any) -> SharingBackend:
    """The backend ``name`` with its ``settings`` (its dataclass fields: gpushare's ``memory_unit``, ...)."""
    cls = BACKENDS.get(name)
    if cls is None:
        raise UnknownBackendError(f"unknown GPU sharing backend {name!r}; use one of {', '.join(BACKENDS)}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise UnknownBackendError(
            f"the {name} backend has no setting {', '.join(unknown)}; "
            f"its settings: {', '.join(sorted(known)) or 'none'}"
        )
    return cls(**settings)


def settings_from_values(name: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of backend ``name`` among the chart's camelCase ``gpuSharing.<name>`` values (the chart's
    own keys, such as kai's createQueues, left out)."""
    cls = BACKENDS.get(name)
    known = {f.name for f in fields(cls)} if cls else set()
    snake = {re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower(): value for key, value in values.items()}
    return {key: value for key, value in snake.items() if key in known}


def slice_note(name: str) -> str:
    """What the spawn form says of slices on backend ``name`` ("" where none are offered)."""
    return BACKENDS[name].slice_note


def read(sharing: SharingBackend, listing: Listing) -> tuple[SharingBackend, Inventory]:
    """``sharing`` fitted to the cluster (``SharingBackend.fit``), and the inventory it reads from ``listing``;
    where the settings disagree with the cluster, the first lines of ``Inventory.warnings`` say so."""
    fitted, notes = sharing.fit(listing)
    inventory = fitted.read_cluster(listing)
    inventory.warnings[:0] = notes
    return fitted, inventory


def build_kube(
    nodes: Iterable[Obj],
    pods: Iterable[Obj],
    sharing: SharingBackend,
    *,
    objects: Mapping[str, Sequence[Obj]] | None = None,
    now: datetime | None = None,
) -> Inventory:
    """The inventory of a cluster from its Node and Pod objects (API JSON as dicts), read by ``sharing``.

    ``objects``: the other lists the backend reads (``sharing.reads``, by key; gpushare also
    takes its ``unhealthy-gpu-<node>`` ConfigMaps as "configmaps"); ``now`` lets state that
    expires (HAMi's node handshake) expire. What cannot be read is in ``Inventory.warnings``.
    """
    return read(sharing, Listing(list(nodes), list(pods), dict(objects or {}), now))[1]


__all__ = ["BACKENDS", "Listing", "SharingBackend", "backend", "build_kube", "names", "read", "register", "slice_note"]
