"""Reading a spawn request: the options a user may send and the refusal they get otherwise."""

from __future__ import annotations

from typing import Any

from tornado import web

from spawner.form import split_gpu_choice
from spawner.inventory import Gpu
from spawner.shares import DEFAULT_SMALLEST_SLICE, GpuRequest, RequestKind, ShareError, parse_request

OPTION_KEYS = frozenset({"gpu_memory", "gpus", "image", "models"})


class GpuRefused(web.HTTPError):
    """A spawn refused before anything was allocated; the message is for the user."""

    def __init__(self, status: int, message: str, reason: str) -> None:
        super().__init__(status, log_message=message, reason=_http_reason(status))
        self.jupyterhub_message = message  # shown on the spawn page and in progress events
        self.refusal = reason
        self.waitable = False  # True when waiting in line could get it (no room, or the group's budget)


def _http_reason(status: int) -> str:
    return {400: "Bad Request", 403: "Forbidden", 409: "Conflict"}.get(status, "Error")


def read_request(
    options: Any,
    default_memory: str,
    gpus: tuple[Gpu, ...],
    max_cards: int,
    keys: frozenset[str] = OPTION_KEYS,
    smallest_slice_bytes: int = DEFAULT_SMALLEST_SLICE,
) -> GpuRequest:
    """The GPU request in ``options`` (user_options); GpuRefused(400) saying what to send instead.

    ``keys``: the options this backend takes (Kubernetes adds ``profile``);
    ``smallest_slice_bytes``: slices below it are refused (spawner/shares.py).
    """
    if not isinstance(options, dict):
        raise GpuRefused(400, "Spawn options must be a JSON object.", "invalid")
    unknown = set(options) - keys
    if unknown:
        raise GpuRefused(
            400,
            f"Unknown spawn option(s): {', '.join(sorted(map(str, unknown)))}. Use gpu_memory, gpus, image and models.",
            "invalid",
        )
    try:
        request = parse_request(
            options.get("gpu_memory", default_memory),
            options.get("gpus", 0),
            largest_card_bytes=max((g.memory_bytes for g in gpus), default=0),
            most_cards=max_cards or len(gpus),
            smallest_slice_bytes=smallest_slice_bytes,
        )
    except ShareError as exc:
        raise GpuRefused(400, str(exc), "invalid") from None
    if request.kind is not RequestKind.CPU and not gpus:
        raise GpuRefused(400, 'This machine has no GPU; ask for gpu_memory "0" (CPU only).', "invalid")
    return request


def options_from_form(formdata: dict[str, list[str]], default_memory: str, default_image: str) -> dict[str, Any]:
    """The spawn form's fields as user_options (the same keys the REST API takes)."""

    def first(name: str, fallback: str) -> str:
        values = formdata.get(name) or [fallback]
        return values[0]

    gpu_memory, gpus = first("gpu_memory", default_memory), first("gpus", "0")
    if "gpu" in formdata:  # the form's one GPU select: "0", a slice ("4GiB") or whole cards ("gpus:2")
        gpu_memory, gpus = split_gpu_choice(first("gpu", "0"))
    options: dict[str, Any] = {
        "gpu_memory": gpu_memory,
        "gpus": gpus,
        "image": first("image", default_image),
        "models": list(formdata.get("models") or []),
    }
    return options
