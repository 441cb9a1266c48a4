"""Local HBM and ASTRA-sim remote-memory model with tensor capacity tracking (`plugin: hbm`)."""

from __future__ import annotations

from typing import Any

from chakra_core.hookspecs import hookimpl
from chakra_sim_memory_hbm.model import HBMConfig, HBMMemory

__all__ = ["HBMConfig", "HBMMemory"]


@hookimpl
def chakra_sim_register_memory(registry):
    registry.add(HBMMemory)


@hookimpl
def chakra_sim_simulation_start(run: dict[str, Any]) -> None:
    """Tell an `hbm` memory layer where the run's trace files are (for `lifetime: trace`).

    Layers do not receive the trace paths (LayerContext.extras has no "trace_files" yet),
    but the resolved manifest does: workload.trace is the absolute prefix and
    workload.ranks the number of files.
    """
    memory = run.get("layers", {}).get("memory")
    if not isinstance(memory, HBMMemory) or memory.context.extras.get("trace_files"):
        return
    workload = run.get("manifest", {}).get("workload", {})
    prefix, ranks = workload.get("trace"), workload.get("ranks")
    if not prefix or not isinstance(ranks, int):
        return
    from chakra_core.et import trace_files

    found = dict(trace_files(prefix))
    if all(rank in found for rank in range(ranks)):
        memory.set_trace_files([found[rank] for rank in range(ranks)])
