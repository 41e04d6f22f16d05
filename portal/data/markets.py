"""The markets as the portal uses them: every write checked against the reader's identity.

The store (market/store.py) does no authorization; this module is where "only
admins publish images", "only admins review models", "a user launches only their own
server" and "three proposals an hour" are enforced, on the server side.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import quote

from market.files import ModelFilesError, checksum, inside, size_of
from market.rules import installed, launch_blocker, local_prefix
from market.store import Image, Model, Store
from portal.data.hub import HubClient
from portal.identity import Identity
from spawner.quotas import DEFAULT_GROUP, GroupRules, rules_for
from spawner.shares import format_bytes, parse_quantity, slice_choices


class MarketRefusedError(ValueError):
    """A market action this person may not do, or bad input; the message says why and what to do."""


@dataclass(frozen=True)
class ImageCard:
    image: Image
    running: int  # servers running it now
    blocker: str  # why this reader cannot launch it ('' : they can)


def image_cards(
    store: Store,
    identity: Identity,
    user_groups: set[str],
    running: dict[str, int],
    platform_prefix: str | None = None,
) -> list[ImageCard]:
    """Active images for everyone, deprecated ones only for admins (to restore them); launchable first.

    ``platform_prefix`` (the local backend): an image whose Python environment is not
    installed on this machine is shown, but not offered for launch.
    """
    cards = []
    for image in store.images(include_deprecated=identity.admin):
        blocker = launch_blocker(
            deprecated=image.status == "deprecated", groups=image.groups, user_groups=user_groups, admin=identity.admin
        )
        if (
            not blocker
            and platform_prefix is not None
            and not installed(local_prefix(image.local_path, platform_prefix))
        ):
            blocker = "not installed on this machine"
        cards.append(ImageCard(image, running.get(image.slug, 0), blocker))
    return sorted(cards, key=lambda c: (bool(c.blocker), c.image.name.lower()))


CPU_ONLY = "0"


def launch_choices(rules: Sequence[GroupRules], my_groups: set[str], largest_card: int) -> tuple[list[str], str]:
    """The GPU choices for launching from the market ("0": CPU only, "4GiB": a slice) and the default.

    Only slices the reader's groups allow (the largest any of them allows; in no group, the
    default rules'); the default is the class's slice, else the smallest slice; CPU only when
    the machine has no GPU.
    """
    mine = rules_for(my_groups, rules)
    in_a_class = any(r.name != DEFAULT_GROUP for r in mine)
    limits = [largest_card if r.quota.max_slice_bytes is None else r.quota.max_slice_bytes for r in mine]
    ceiling = min(largest_card, max(limits, default=largest_card))
    sizes = sorted(set(slice_choices(ceiling)) | {min(limit, ceiling) for limit in limits if limit})
    values = [CPU_ONLY, *(format_bytes(size).replace(" ", "") for size in sizes)]
    class_slice = in_a_class and next((min(limit, ceiling) for limit in limits if limit < largest_card), None)
    if class_slice:
        return values, format_bytes(class_slice).replace(" ", "")
    return values, values[1] if len(values) > 1 else CPU_ONLY


def gpu_label(value: str) -> str:
    """A launch choice as the form says it: "No GPU (CPU only)", "4 GiB of one GPU"."""
    if value == CPU_ONLY:
        return "No GPU (CPU only)"
    return f"{format_bytes(parse_quantity(value))} of one GPU"


def server_url(identity: Identity) -> str:
    """Where the reader's default server answers (JupyterHub's /user/<name>/ under the same host)."""
    return f"/user/{quote(identity.name)}/"


def launch(
    client: HubClient,
    store: Store,
    identity: Identity,
    slug: str,
    models: list[str] | None = None,
    gpu_memory: str = CPU_ONLY,
) -> str:
    """Start the reader's own default server with the image and GPU choice; the hub's refusal
    becomes MarketRefusedError."""
    image = store.image(slug)
    if image is None or image.status != "active":
        raise MarketRefusedError(f"Image {slug!r} cannot be launched: it is not in the market or is deprecated.")
    options: dict[str, object] = {"image": slug, "gpu_memory": gpu_memory}
    if models is not None:
        options["models"] = models
    response = client.post(f"/users/{identity.name}/server", options)
    if response.status_code in (201, 202):
        gpu = "no GPU (CPU only)" if gpu_memory == CPU_ONLY else gpu_label(gpu_memory)
        return f"Starting your server with {image.name} and {gpu}."
    try:
        message = str(response.json().get("message", ""))
    except ValueError:
        message = response.text[:200]
    raise MarketRefusedError(message or f"The hub refused the launch (HTTP {response.status_code}).")


def _admin(identity: Identity, what: str) -> None:
    if not identity.admin:
        raise PermissionError(f"only admins can {what}; ask an admin of this platform")


def publish_image(store: Store, identity: Identity, image: Image) -> str:
    _admin(identity, "publish or edit images")
    return store.save_image(image, actor=identity.name)


def set_image_status(store: Store, identity: Identity, slug: str, status: str) -> Image:
    _admin(identity, "deprecate or restore images")
    return store.set_image_status(slug, status, actor=identity.name)


def visible_models(store: Store, identity: Identity) -> list[Model]:
    """Approved models for everyone; pending and rejected ones for admins and their proposers."""
    return [m for m in store.models() if m.status == "approved" or identity.admin or m.proposed_by == identity.name]


def propose_model(
    store: Store, identity: Identity, model: Model, models_root: Path, per_hour: int, now: float | None = None
) -> Model:
    """A pending entry; the folder must already be under the models root (checked, checksummed)."""
    recent = store.proposals_since(identity.name, (now or time.time()) - 3600)
    if recent >= per_hour and not identity.admin:
        raise MarketRefusedError(
            f"You have proposed {recent} models in the last hour (the limit is {per_hour}); try later."
        )
    try:
        folder = inside(models_root, model.path)
    except ModelFilesError as exc:
        raise MarketRefusedError(f"Files: {exc}. Copy the model into {models_root} first.") from None
    try:
        return store.propose_model(
            replace(model, checksum=checksum(folder), size_bytes=size_of(folder)), actor=identity.name
        )
    except KeyError as exc:
        raise MarketRefusedError(str(exc.args[0])) from None


def review_model(store: Store, identity: Identity, slug: str, approve: bool, note: str = "") -> Model:
    _admin(identity, "approve or reject models")
    return store.review_model(slug, approve, actor=identity.name, note=note)


def use_model(store: Store, identity: Identity, slug: str, chosen: bool = True) -> None:
    """Mount (or stop mounting) an approved model in the reader's next server."""
    model = store.model(slug)
    if chosen and (model is None or model.status != "approved"):
        raise MarketRefusedError(f"Model {slug!r} is not approved; only approved models can be mounted.")
    store.select_model(identity.name, slug, chosen)
