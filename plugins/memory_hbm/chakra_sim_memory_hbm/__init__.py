"""Local HBM and ASTRA-sim remote-memory model with tensor capacity tracking (`plugin: hbm`)."""

from __future__ import annotations

from chakra_core import hookimpl
from chakra_sim_memory_hbm.model import HBMConfig, HBMMemory

__all__ = ["HBMConfig", "HBMMemory"]


@hookimpl
def chakra_sim_register_memory(registry):
    registry.add(HBMMemory)

