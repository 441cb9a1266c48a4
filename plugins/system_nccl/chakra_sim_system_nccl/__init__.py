"""NCCL-aware system layer (`plugin: nccl`), its cost model, the nccl-tests reader, and the
`chakra-sim calibrate` and `chakra-sim accuracy` commands."""

from __future__ import annotations

from chakra_core import hookimpl
from chakra_core.contract.registry import CommandRegistry, ProfileSectionRegistry, SystemRegistry
from chakra_sim_system_nccl.layer import NcclSystem, NcclSystemConfig
from chakra_sim_system_nccl.section import CALIBRATION_KEY, NCCL_KEY, Calibration, NcclSpec

__all__ = ["Calibration", "NcclSpec", "NcclSystem", "NcclSystemConfig"]


@hookimpl
def chakra_sim_register_system(registry: SystemRegistry) -> None:
    registry.add(NcclSystem)


@hookimpl
def chakra_sim_register_profile_sections(registry: ProfileSectionRegistry) -> None:
    registry.add(NCCL_KEY, NcclSpec)
    registry.add(CALIBRATION_KEY, Calibration)


@hookimpl
def chakra_sim_register_commands(registry: CommandRegistry) -> None:
    from chakra_sim_system_nccl.cli import accuracy, calibrate   # click, rich and scipy only when asked for

    registry.add(calibrate)
    registry.add(accuracy)
