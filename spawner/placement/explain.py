"""Explain a refusal: why nothing fits a demand now, and what would start now. Pure code."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from spawner.inventory import Gpu, Inventory, Node
from spawner.placement.state import EPS, Demand
from spawner.shares import format_bytes


@dataclass(frozen=True)
class Explanation:
    """Why a demand does not fit now, in words, plus the numbers behind them."""

    summary: str
    reasons: tuple[str, ...]
    largest_free_bytes: int
    largest_free_where: str
    free_cards: int
    suggestion: str

    def __str__(self) -> str:
        return " ".join((self.summary, *self.reasons, self.suggestion)).strip()


def explain(demand: Demand, inventory: Inventory, asked: str = "") -> Explanation:
    """Say why nothing fits ``demand``: the largest free slice and where, how many cards
    are wholly free, which constraint ruled out the rest, and what would start now."""
    asked = asked or demand.request().describe()
    reasons: Counter[str] = Counter()
    best_bytes, best_where, best_cards = 0, "", 0
    for node in inventory.nodes:
        if not node.healthy:
            reasons["node"] += len(node.gpus) or 1
            continue
        short = _host_shortfall(node, demand)
        eligible = []
        for gpu in node.gpus:
            if not gpu.healthy:
                reasons["unhealthy"] += 1
            elif demand.models is not None and gpu.model not in demand.models:
                reasons["model"] += 1
            elif short:
                reasons[short] += 1
            else:
                eligible.append(gpu)
        if short and not node.gpus and not demand.uses_gpu:
            reasons[short] += 1
        for gpu in eligible:
            if gpu.free_bytes > best_bytes:
                best_bytes, best_where = gpu.free_bytes, f"{node.name} GPU {gpu.index} ({gpu.model})"
        best_cards = max(best_cards, sum(1 for g in eligible if g.is_free))
        reasons["too-small"] += sum(1 for g in eligible if not _gpu_holds(g, demand))
    texts = _reason_texts(reasons, demand)
    return Explanation(
        summary=f"Nothing can hold {asked} right now.",
        reasons=tuple(texts),
        largest_free_bytes=best_bytes,
        largest_free_where=best_where,
        free_cards=best_cards,
        suggestion=_suggestion(demand, best_bytes, best_where, best_cards),
    )


def _host_shortfall(node: Node, demand: Demand) -> str:
    if node.cpu_free_milli < demand.cpu_milli:
        return "cpu"
    if node.memory_free_bytes < demand.memory_bytes:
        return "memory"
    return ""


def _gpu_holds(gpu: Gpu, demand: Demand) -> bool:
    if demand.gpus:
        return gpu.is_free
    need = demand.slice_units if demand.slice_units else (demand.slice_fraction or 0.0) * gpu.memory_bytes
    return gpu.free_bytes >= need - EPS


def _reason_texts(reasons: Counter[str], demand: Demand) -> list[str]:
    texts = []
    if reasons["model"]:
        allowed = ", ".join(sorted(demand.models or ()))
        texts.append(f"{_gpus(reasons['model'])} of another model (this server needs {allowed}).")
    if reasons["cpu"]:
        texts.append(f"{_gpus(reasons['cpu'])} on machines without {demand.cpu_milli / 1000:g} free CPUs.")
    if reasons["memory"]:
        texts.append(f"{_gpus(reasons['memory'])} on machines without {format_bytes(demand.memory_bytes)} free memory.")
    if reasons["unhealthy"] or reasons["node"]:
        texts.append(f"{_gpus(reasons['unhealthy'] + reasons['node'])} out of service.")
    if reasons["too-small"]:
        what = "already partly in use" if demand.gpus else "without enough free memory"
        texts.append(f"{_gpus(reasons['too-small'])} {what}.")
    return texts


def _gpus(n: int) -> str:
    return f"{n} GPU{'s' if n != 1 else ''} {'is' if n == 1 else 'are'}"


def _suggestion(demand: Demand, best_bytes: int, best_where: str, best_cards: int) -> str:
    if demand.gpus:
        if best_cards:
            are = "GPUs are" if best_cards > 1 else "GPU is"
            return f"{best_cards} whole {are} free on one machine: ask for gpus={best_cards} to start now."
        if best_bytes:
            return (
                f"No whole GPU is free; the largest free slice is {format_bytes(best_bytes)} on {best_where}: "
                "ask for that or less to start now."
            )
        return "No GPU is free: try again when someone stops a server, or ask for a CPU-only server."
    if best_bytes:
        return (
            f"The largest free slice is {format_bytes(best_bytes)} on {best_where}: ask for that or less to start now."
        )
    if demand.uses_gpu:
        return "No GPU memory is free: try again when someone stops a server, or ask for a CPU-only server."
    return "Try again when a machine has room."
