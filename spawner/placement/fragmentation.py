"""The fragmentation model of FGD (Weng et al., "Beware of Fragmentation", ATC'23).

A node's fragmentation is the free GPU that the target workload's task types cannot
use, weighted by how popular each type is. Pure code over ``ClusterState`` arrays.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from spawner.placement.state import EPS, BoolArray, ClusterState, Demand, FloatArray, IntArray


@dataclass(frozen=True)
class Workload:
    """The target workload: task types and their popularity (weights sum to 1)."""

    demands: tuple[Demand, ...]
    weights: tuple[float, ...]

    @classmethod
    def from_demands(cls, demands: Iterable[Demand], coverage: float = 1.0, max_types: int = 64) -> Workload:
        """Types by frequency, the most popular first, until ``coverage`` of tasks are covered."""
        counts = Counter(demands)
        total = sum(counts.values())
        if total == 0:
            raise ValueError("a workload needs at least one demand")
        kept: list[tuple[Demand, int]] = []
        covered = 0
        # Most popular first; equal counts in a fixed order, so that the same demands in any
        # arrival order make the same workload (and the same floating-point sums).
        ranked = sorted(counts.items(), key=lambda item: (-item[1], repr(item[0])))
        for demand, count in ranked[:max_types]:
            kept.append((demand, count))
            covered += count
            if covered >= coverage * total:
                break
        weight_sum = sum(c for _, c in kept)
        return cls(tuple(d for d, _ in kept), tuple(c / weight_sum for _, c in kept))


@dataclass
class WorkloadArrays:
    cpu: FloatArray
    mem: FloatArray
    whole: FloatArray  # whole cards asked (0 for slice and CPU-only types)
    frac: FloatArray  # slice share of a card
    units: FloatArray  # slice in units
    is_slice: BoolArray
    is_cpu: BoolArray
    model_mask: BoolArray  # (M, T): model m acceptable to type t
    weight: FloatArray

    @classmethod
    def build(cls, workload: Workload, model_names: Sequence[str]) -> WorkloadArrays:
        ds = workload.demands
        mask = np.array(
            [[d.models is None or m in d.models for d in ds] for m in model_names] or [[True] * len(ds)], dtype=bool
        )
        return cls(
            cpu=np.array([d.cpu_milli for d in ds], dtype=np.float64),
            mem=np.array([d.memory_bytes for d in ds], dtype=np.float64),
            whole=np.array([d.gpus for d in ds], dtype=np.float64),
            frac=np.array([d.slice_fraction or 0.0 for d in ds]),
            units=np.array([d.slice_units or 0.0 for d in ds]),
            is_slice=np.array([d.is_slice for d in ds], dtype=bool),
            is_cpu=np.array([not d.uses_gpu for d in ds], dtype=bool),
            model_mask=mask,
            weight=np.array(workload.weights),
        )


def fragmentation(
    wl: WorkloadArrays,
    free: FloatArray,
    cap: FloatArray,
    model: IntArray,
    usable: BoolArray,
    cpu: FloatArray,
    mem: FloatArray,
    *,
    cpu_tasks_fragment: bool = True,
) -> FloatArray:
    """Expected GPU fragmentation, in cards, of each of C node states against the workload.

    For a task type t, a node's fragment is the free GPU that t cannot use: all of
    it when t does not fit the node at all (CPU, memory, model or GPU), otherwise
    the free part of each GPU too small for t (for whole-card types, every GPU that is
    not wholly free). For a type that asks for no GPU the paper counts all free GPU as
    fragment; ``cpu_tasks_fragment=False`` counts it only when the task does not fit.
    """
    safe_cap = np.where(cap > 0, cap, 1.0)
    frac = np.where(usable, free / safe_cap, 0.0)  # (C, G)
    total = frac.sum(axis=1)  # (C,)
    allowed = wl.model_mask[model] & usable[:, :, None]  # (C, G, T)
    need = wl.frac[None, None, :] * cap[:, :, None] + wl.units[None, None, :]
    fits = allowed & (free[:, :, None] >= need - EPS)  # GPU holds a slice of type t
    full = allowed & (free >= cap - EPS)[:, :, None]
    slice_frag = np.einsum("cg,cgt->ct", frac, ~fits)
    whole_frag = np.einsum("cg,cgt->ct", frac, ~full)
    slice_fit = fits.any(axis=1)
    whole_fit = full.sum(axis=1) >= wl.whole[None, :]
    host = (cpu[:, None] >= wl.cpu[None, :]) & (mem[:, None] >= wl.mem[None, :])
    gpu_fit = np.where(wl.is_slice[None, :], slice_fit, whole_fit)
    frag = np.where(wl.is_slice[None, :], slice_frag, whole_frag)
    per_type = np.where(host & gpu_fit, frag, total[:, None])
    cpu_value = total[:, None] if cpu_tasks_fragment else np.where(host, 0.0, total[:, None])
    per_type = np.where(wl.is_cpu[None, :], cpu_value, per_type)
    return np.asarray(per_type @ wl.weight)


def row_hash_weights(width: int) -> FloatArray:
    """Fixed random weights: equal rows get equal hashes, distinct rows (almost surely) not."""
    if width not in _HASH_WEIGHTS:
        _HASH_WEIGHTS[width] = np.random.default_rng(width).uniform(1.0, 2.0, width)
    return _HASH_WEIGHTS[width]


_HASH_WEIGHTS: dict[int, FloatArray] = {}


def distinct_gpus(state: ClusterState, cand: BoolArray) -> BoolArray:
    """Drop candidate GPUs equal (free, size, model) to an earlier candidate on the same node."""
    same = (
        (state.free[:, :, None] == state.free[:, None, :])
        & (state.cap[:, :, None] == state.cap[:, None, :])
        & (state.model[:, :, None] == state.model[:, None, :])
        & cand[:, None, :]
    )
    earlier = np.tril(np.ones((cand.shape[1], cand.shape[1]), dtype=bool), k=-1)
    return np.asarray(cand & ~(same & earlier).any(axis=2), dtype=bool)
