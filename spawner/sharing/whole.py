"""Whole cards only (NVIDIA's device plugin, no sharing): ``nvidia.com/gpu: N``.

Everything is the interface's default behaviour (spawner/sharing/base.py): a slice is refused
with advice, a node's cards are its allocatable ``nvidia.com/gpu`` of GPU feature discovery's
memory, a pod's cards the first free ones.
"""

from __future__ import annotations

from dataclasses import dataclass

from spawner.sharing.base import SharingBackend


@dataclass(frozen=True)
class Whole(SharingBackend):
    name = "whole"
    slice_note = ""
    extender = True
