"""The results document (what results.json holds).

Stable keys scripts rely on: top-level "finish_ns" (maximum over ranks),
"ranks" (a list of objects with at least "rank", "finish_ns", "compute_ns",
"exposed_comm_ns"), and "manifest" (the resolved configuration). Everything
else may grow. Times are integer ns; sizes bytes. The document holds no wall
clock figures, so identical inputs give byte-identical files.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from chakra_core import __version__

if TYPE_CHECKING:
    from chakra_core.engine.simulation import Simulation

SCHEMA_VERSION = 1


def build_results(sim: "Simulation") -> dict[str, Any]:
    ranks = []
    for driver in sim.drivers:
        row: dict[str, Any] = {
            "rank": driver.rank,
            "finish_ns": driver.finish_ns,
            "compute_ns": driver.compute_ns,
            "cpu_ns": driver.cpu_ns,
            "exposed_comm_ns": driver.exposed_comm_ns,
            "comm_ns": driver.comm_ns,
            "memory_ns": driver.memory_ns,
            "idle_ns": driver.idle_ns,
            "comm_bytes_by_type": dict(sorted(driver.comm_bytes.items())),
            "node_counts": dict(sorted(driver.node_counts.items())),
        }
        for layer in ("system", "network", "compute", "memory"):
            instance = sim.layers.get(layer)
            if instance is not None:
                row.update(instance.rank_summary(driver.rank))
        row.setdefault("bytes_sent", 0)
        ranks.append(row)
    layers = {}
    for layer, instance in sim.layers.items():
        layers[layer] = {"plugin": instance.name, "fidelity": instance.fidelity,
                         "summary": instance.summary()}
        tables = instance.terminal_tables()
        if tables:
            layers[layer]["highlights"] = [{"title": title, "columns": columns, "rows": rows}
                                           for title, columns, rows in tables]
    return {
        "schema_version": SCHEMA_VERSION,
        "chakra_sim_version": __version__,
        "finish_ns": max((r["finish_ns"] for r in ranks), default=0),
        "num_ranks": len(ranks),
        "events": sim.queue.executed,
        "ranks": ranks,
        "layers": layers,
        "warnings": list(sim.context.warnings),
        "manifest": sim.spec.manifest,
    }
