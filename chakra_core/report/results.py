"""The results of a finished run (`build_results`), and what results.json holds.

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

import json
import math
import re
from functools import lru_cache
from typing import Any

from chakra_core._version import __version__
from chakra_core.contract.layers import LayerModel, MemoryModel, SystemLayer
from chakra_core.engine.driver import BREAKDOWN
from chakra_core.engine.simulation import FinishedRun
from chakra_core.errors import SimulationError
from chakra_core.limits import TIME_NS
from chakra_core.report.document import FoldingResult, Highlight, LayerResult, RankResult, Results
from chakra_core.json_types import JsonObject

CORE_RANK_KEYS = frozenset({"rank", "finish_ns", *BREAKDOWN, "compute_ns", "exposed_comm_ns", "comm_ns",
                            "bytes_sent", "bytes_received", "comm_bytes_by_type", "node_counts"})
"""A rank's keys no plugin's statistics may take."""


def build_results(run: FinishedRun) -> Results:
    """The results of a finished run (calls each layer's summaries)."""
    ranks = []
    system = run.layers.get("system")
    for record in run.ranks:
        breakdown = record.breakdown
        if sum(breakdown.values()) != record.finish_ns:
            raise SimulationError(f"internal error: rank {record.rank}'s time categories {breakdown} do "
                                  f"not sum to its finish time {record.finish_ns} ns (please report this)")
        traffic = system.traffic(record.rank) if isinstance(system, SystemLayer) else None
        sent, received = traffic if traffic is not None else (0, 0)
        stats = {}
        for layer in ("system", "network", "compute", "memory"):
            instance = run.layers.get(layer)
            if instance is not None:
                rank_stats = instance.rank_summary(record.rank)
                if rank_stats and instance.name not in CORE_RANK_KEYS and instance.name not in stats:
                    stats[instance.name] = rank_stats
        ranks.append(RankResult(record.rank, record.finish_ns, breakdown, record.compute_ns, record.comm_ns, sent,
                                received, dict(sorted(record.comm_bytes.items())),
                                dict(sorted(record.node_counts.items())), stats))
    folding = run.folding
    if folding is not None:     # every rank gets its representative's row
        by_rep = {row.rank: row for row in ranks}
        ranks = [by_rep[folding.representative[rank]].for_rank(rank) for rank in range(len(folding.representative))]
    results = Results(__version__, run.events, _folding(run), tuple(ranks),
                      {layer: _layer(layer, instance) for layer, instance in run.layers.items()},
                      tuple(run.warnings), run.spec.manifest)
    _check_numbers(results.to_json())
    return results


def _layer(layer: str, instance: LayerModel) -> LayerResult:
    summary = instance.summary()
    peak = None
    if isinstance(instance, MemoryModel) and instance.tracks_tensors:   # the core writes the contract's key
        peak = instance.peak_memory_bytes()
        summary = {**summary, "peak_memory_bytes": peak}
    highlights = tuple(Highlight(title, tuple(columns), tuple(tuple(row) for row in rows))
                       for title, columns, rows in instance.terminal_tables())
    return LayerResult(layer, instance.name, instance.fidelity, summary, highlights, peak)


def _check_numbers(document: JsonObject) -> None:
    """A SimulationError naming the key path of the first number results.json cannot hold:
    NaN or infinity (strict JSON has neither) or a time beyond `limits.TIME_NS`."""
    max_ns = TIME_NS.value()
    if not _holdable(document, max_ns):   # the usual case passes without a key path per value
        _walk_numbers(document, max_ns)


def _walk_numbers(document: JsonObject, max_ns: int) -> None:
    """_check_numbers value by value, with each one's key path."""
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


def _holdable(document: JsonObject, max_ns: int) -> bool:
    """Whether every number is surely finite and every time at most max_ns, read at C speed from
    the document's strict JSON text: the encoder refuses NaN and infinity, and a number above
    max_ns is written with at least as many digits as max_ns, or with a positive exponent (floats
    from 1e16 on). Only a key ending in `_ns` holds a time (`_walk_numbers`), and in this text
    `_ns": ` can only end such a key (a quote inside a string is escaped), so a long number
    elsewhere (a 16,384-GPU job's total FLOPs, 4e+19) does not send every value through the walk.
    False (then the exact walk decides) for any such number after such a key."""
    try:
        text = json.dumps(document, allow_nan=False).encode()   # ASCII: non-ASCII characters are escaped
    except (ValueError, TypeError):
        return False
    return _long_time(len(str(max_ns))).search(text) is None


@lru_cache(maxsize=4)
def _long_time(digits: int) -> re.Pattern[bytes]:
    """A time value of at least `digits` digits or with a positive exponent."""
    return re.compile(rb'_ns": -?(?:[0-9]{%d,}|[0-9.]+e\+)' % digits)


def _folding(run: FinishedRun) -> FoldingResult:
    """Whether one rank stood for others (chakra_core.engine.folding), and which."""
    folding = run.folding
    if folding is None:
        return FoldingResult(False, run.num_ranks, run.fold_note, time=run.time_fold)
    return FoldingResult(True, len(folding.members),
                         representatives={str(rep): len(members) for rep, members in sorted(folding.members.items())},
                         time=run.time_fold)
