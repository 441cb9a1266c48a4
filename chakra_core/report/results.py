"""The results document (what results.json holds).

Stable keys scripts rely on: top-level "finish_ns" (maximum over ranks),
"ranks" (a list of objects with at least "rank", "finish_ns", the six time
categories of `BREAKDOWN`, which sum to "finish_ns", "compute_ns",
"exposed_comm_ns", "bytes_sent" and "bytes_received"), and "manifest" (the
resolved configuration). "folding" says whether ranks were folded (one simulated per
class of equivalent ranks, chakra_core.engine.folding). A layer's own per-rank statistics sit in the rank's
entry under the layer's plugin name ("hbm": {...}), its run statistics under
"layers"; no plugin can overwrite a core key. Everything else may grow.
Times are integer ns; sizes bytes. The document holds no wall clock figures,
so identical inputs give byte-identical files.
"""

from __future__ import annotations

import math
from typing import Any

from chakra_core._version import __version__
from chakra_core.contract.layers import SystemLayer
from chakra_core.engine.simulation import FinishedRun
from chakra_core.errors import SimulationError
from chakra_core.limits import TIME_NS

SCHEMA_VERSION = 2
"""2: the exclusive time breakdown; layer statistics under the plugin's name."""


def build_results(run: FinishedRun) -> dict[str, Any]:
    """The results document of a finished run (calls each layer's summaries)."""
    ranks = []
    system = run.layers.get("system")
    for record in run.ranks:
        breakdown = record.breakdown
        if sum(breakdown.values()) != record.finish_ns:
            raise SimulationError(f"internal error: rank {record.rank}'s time categories {breakdown} do "
                                  f"not sum to its finish time {record.finish_ns} ns (please report this)")
        traffic = system.traffic(record.rank) if isinstance(system, SystemLayer) else None
        sent, received = traffic if traffic is not None else (0, 0)
        row: dict[str, Any] = {
            "rank": record.rank,
            "finish_ns": record.finish_ns,
            **breakdown,
            "compute_ns": record.compute_ns,
            "exposed_comm_ns": breakdown["exposed_network_ns"] + breakdown["waiting_ns"],
            "comm_ns": record.comm_ns,
            "bytes_sent": sent,
            "bytes_received": received,
            "comm_bytes_by_type": dict(sorted(record.comm_bytes.items())),
            "node_counts": dict(sorted(record.node_counts.items())),
        }
        for layer in ("system", "network", "compute", "memory"):
            instance = run.layers.get(layer)
            if instance is not None:
                stats = instance.rank_summary(record.rank)
                if stats and instance.name not in row:
                    row[instance.name] = stats
        ranks.append(row)
    folding = run.folding
    if folding is not None:     # every rank gets its representative's row
        by_rep = {row["rank"]: row for row in ranks}
        ranks = [dict(by_rep[folding.representative[rank]], rank=rank)
                 for rank in range(len(folding.representative))]
    layers: dict[str, Any] = {}
    for layer, instance in run.layers.items():
        layers[layer] = {"plugin": instance.name, "fidelity": instance.fidelity,
                         "summary": instance.summary()}
        tables = instance.terminal_tables()
        if tables:
            layers[layer]["highlights"] = [{"title": title, "columns": columns, "rows": rows}
                                           for title, columns, rows in tables]
    document = {
        "schema_version": SCHEMA_VERSION,
        "chakra_sim_version": __version__,
        "finish_ns": max((r["finish_ns"] for r in ranks), default=0),
        "num_ranks": len(ranks),
        "events": run.events,
        "folding": _folding(run),
        "ranks": ranks,
        "layers": layers,
        "warnings": list(run.warnings),
        "manifest": run.spec.manifest,
    }
    _check_numbers(document)
    return document


def _check_numbers(document: dict[str, Any]) -> None:
    """A SimulationError naming the key path of the first number results.json cannot hold:
    NaN or infinity (strict JSON has neither) or a time beyond `limits.TIME_NS`."""
    max_ns = TIME_NS.value()
    stack: list[tuple[Any, str]] = [(document, "")]
    while stack:
        value, key_path = stack.pop()
        if isinstance(value, dict):
            stack.extend((v, f"{key_path}.{k}" if key_path else str(k)) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, f"{key_path}[{i}]") for i, v in enumerate(value))
        elif isinstance(value, float) and not math.isfinite(value):
            raise SimulationError(f"results: {key_path} is {value} (a layer computed a number that is not "
                                  "finite; results.json holds strict JSON)")
        elif key_path.endswith("_ns") and isinstance(value, (int, float)) and value > max_ns:
            raise SimulationError(f"results: {key_path} is {value:,} ns; {TIME_NS.hint()}")


def _folding(run: FinishedRun) -> dict[str, Any]:
    """Whether one rank stood for others (chakra_core.engine.folding), and which."""
    folding = run.folding
    if folding is None:
        return {"folded": False, "simulated_ranks": run.num_ranks, "reason": run.fold_note}
    return {"folded": True, "simulated_ranks": len(folding.members), "classes": len(folding.members),
            "representatives": {str(rep): len(members) for rep, members in sorted(folding.members.items())}}
