"""NCCL-aware system layer (`plugin: nccl`)."""

from __future__ import annotations

from chakra_core import hookimpl
from chakra_sim_system_nccl.layer import NcclSystem, NcclSystemConfig

__all__ = ["NcclSystem", "NcclSystemConfig"]


@hookimpl
def chakra_sim_register_system(registry):
    registry.add(NcclSystem)
