"""The images and models a server may run with: the settings' images and the market's.

``ImagesMixin`` reads the request's ``image`` and ``models`` and checks them against the
market (deprecated, group-restricted, not installed, not approved); part of
``spawner.mixin.GpuShareMixin``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traitlets import Dict, HasTraits, Unicode, default

from market.files import ModelFilesError, inside
from market.rules import installed, launch_blocker, local_prefix
from market.store import Model, Store, market_store
from spawner.request import GpuRefused


@dataclass(frozen=True)
class SpawnImage:
    """An image a server can run: a Python environment prefix (local) or a container (Kubernetes)."""

    slug: str
    description: str
    target: str
    deprecated: bool = False
    groups: frozenset[str] = frozenset()


class ImagesMixin(HasTraits):
    """Images and models for a spawner (expects JupyterHub's Spawner ``user`` and ``user_options``)."""

    gpu_images = Dict(
        help="""Images a server may run from: id -> {"path": python env prefix, "description": text}.
        The id "default" runs from the hub's own environment.""",
    ).tag(config=True)
    gpu_default_image = Unicode("default", help="Image used when a request names none.").tag(config=True)
    gpu_market_url = Unicode(
        "", help="SQLAlchemy URL of the image and model market ('' : images come from gpu_images only)."
    ).tag(config=True)
    gpu_models_root = Unicode("", help="Folder holding the model market's files.").tag(config=True)

    @default("gpu_images")
    def _default_images(self) -> dict[str, Any]:
        return {"default": {"path": self.platform_prefix(), "description": "The platform's own Python environment"}}

    def platform_prefix(self) -> str:
        """Where the platform's own environment is, for servers (LocalGpuSpawner: the users' copy)."""
        return sys.prefix

    def images(self) -> dict[str, SpawnImage]:
        """Every image this machine can run: the settings' and the market's."""
        found = {
            slug: SpawnImage(slug, str(spec.get("description", "")), str(spec.get("path") or self.platform_prefix()))
            for slug, spec in self.gpu_images.items()
        }
        store = self._market()
        if store is not None:
            for image in store.images():
                path = local_prefix(image.local_path, self.platform_prefix())
                if path is not None:
                    found[image.slug] = SpawnImage(
                        image.slug, image.name, str(path), image.status == "deprecated", frozenset(image.groups)
                    )
        return found

    def _chosen_image(self, slug: Any) -> str:
        images = self.images()
        offered = [i.slug for i in self.launchable_images()]
        image = images.get(slug) if isinstance(slug, str) else None
        if image is None:
            raise GpuRefused(400, f"Unknown image {slug!r}; choose one of: {', '.join(sorted(offered))}.", "invalid")
        if image.deprecated:
            raise GpuRefused(
                400, f"Image {slug!r} is deprecated; choose one of: {', '.join(sorted(offered))}.", "invalid"
            )
        blocker = self._launch_blocker(image)
        if blocker:
            raise GpuRefused(403, f"Image {slug!r} is {blocker}.", "quota")
        if not self.image_available(image):
            raise GpuRefused(
                400,
                f"Image {slug!r} is not installed on this machine (no {image.target}/bin/jupyterhub-singleuser); "
                "choose another or ask an admin to install it.",
                "invalid",
            )
        return image.slug

    def image_available(self, image: SpawnImage) -> bool:
        """Whether this backend can run the image (locally: its environment is installed)."""
        return installed(Path(image.target))

    def _may_launch(self, image: SpawnImage) -> bool:
        return not self._launch_blocker(image)

    def _launch_blocker(self, image: SpawnImage) -> str:
        return launch_blocker(
            deprecated=image.deprecated,
            groups=image.groups,
            user_groups=[g.name for g in self.user.groups],  # type: ignore[attr-defined]
            admin=bool(self.user.admin),  # type: ignore[attr-defined]
        )

    def _market(self) -> Store | None:
        return market_store(self.gpu_market_url) if self.gpu_market_url else None

    def wanted_models(self, backend_ready: bool) -> list[Model]:
        """The approved models to mount, from the request or the user's "Use in notebook" picks.

        ``backend_ready``: whether this backend has somewhere to mount them from.
        """
        options = self.user_options or {}  # type: ignore[attr-defined]
        store = self._market()
        wanted = options.get("models")
        if wanted is None:
            wanted = store.selected_models(self.user.name) if store else []  # type: ignore[attr-defined]
        return self.models_named(wanted, backend_ready)

    def models_named(self, wanted: Any, backend_ready: bool) -> list[Model]:
        """The approved models of these ids (a server's or a job's); GpuRefused(400) naming one that is not."""
        store = self._market()
        if not isinstance(wanted, list) or not all(isinstance(m, str) for m in wanted):
            raise GpuRefused(400, 'models must be a list of model ids, for example ["langid-97"].', "invalid")
        if wanted and (store is None or not backend_ready):
            raise GpuRefused(400, "This platform has no model market; leave models out.", "invalid")
        models = []
        for slug in dict.fromkeys(wanted):
            model = store.model(slug) if store else None
            if model is None or model.status != "approved":
                raise GpuRefused(400, f"Model {slug!r} is not an approved model in the market.", "invalid")
            models.append(model)
        return models

    def gpu_model_folders(self, wanted: list[str] | None = None) -> dict[str, Path]:
        """Each wanted model's folder under the models root (checked again: no way out of it); ``wanted``: a
        job's model ids (None: the spawn's options)."""
        folders: dict[str, Path] = {}
        ready = bool(self.gpu_models_root)
        models = self.wanted_models(ready) if wanted is None else self.models_named(wanted, ready)
        for model in models:
            try:
                folders[model.slug] = inside(Path(self.gpu_models_root), model.path)
            except ModelFilesError as exc:
                raise GpuRefused(400, f"Model {model.slug!r} cannot be mounted: {exc}", "invalid") from None
        return folders

    def launchable_images(self) -> list[SpawnImage]:
        return [i for i in self.images().values() if self._may_launch(i) and self.image_available(i)]

    def approved_models(self) -> list[Model]:
        store = self._market()
        return store.models(["approved"]) if store and self.gpu_models_root else []

    def selected_models(self) -> set[str]:
        store = self._market()
        return set(store.selected_models(self.user.name)) if store else set()  # type: ignore[attr-defined]
