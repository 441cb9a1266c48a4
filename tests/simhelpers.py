"""Running small simulations from node lists, for engine and system-layer tests.

The builders and `simulate` are `chakra_core.testing`'s (public, for plugin authors), re-exported
here; what stays is specific to this repository's tests (its data folder, ASTRA-sim formulas).
"""

from __future__ import annotations

import json
from pathlib import Path

from typing import Any

from chakra_core.testing import collective, comp, manifest, recv, send, simulate, uniform_network, write_ranks

__all__ = ["DATA", "MICRO", "GIB", "collective", "comp", "manifest", "recv", "ring_network", "send",
           "simulate", "uniform_network", "write_ranks", "hop_ns", "PairDelayNetwork",
           "REF_RESULTS", "astra_cases", "run_astra_case", "results_of", "job_folded_and_unfolded", "changed_job"]

DATA = Path(__file__).resolve().parent / "data"
MICRO = DATA / "astra-microbenchmarks"

GIB = 1 << 30

REF_RESULTS = Path(__file__).resolve().parents[1].parent / "shared" / "ref-results"
"""ASTRA-sim's own numbers on the reference traces (`../shared`, beside the checkout; may be absent)."""
ASTRA_BACKENDS = {"congestion_unaware": "analytical", "congestion_aware": "congestion"}


def astra_cases(backend: str | None = None) -> list[dict]:
    """The runs of ../shared/ref-results/astra-sim.json that ASTRA-sim completed (none without ../shared)."""
    path = REF_RESULTS / "astra-sim.json"
    if not path.exists():
        return []
    return [case for case in json.loads(path.read_text())["runs"]
            if case["ok"] and (backend is None or case["backend"] == backend)]


def run_astra_case(case: dict, host=None) -> dict:
    """Run one ASTRA-sim reference case as `chakra-sim run --workload ... --astra-*` would."""
    from chakra_core.run import load_astra, simulate as simulate_run

    traces = REF_RESULTS.parent / "ref-traces"
    config = load_astra(str(traces / case["workload"]), str(REF_RESULTS / case["system"]),
                        str(REF_RESULTS / case["network"]), network_plugin=ASTRA_BACKENDS[case["backend"]],
                        host=host)
    return simulate_run(config, host, timeline=False).document


def results_of(rows: list[dict[str, Any]], summaries: dict[str, dict[str, Any]] | None = None,
               warnings: tuple[str, ...] = ()):
    """Results of made-up ranks (rows as results.json's, keys left out read 0) and layers
    (layer -> its summary), for tests of what reads results."""
    from chakra_core.report.document import FoldingResult, LayerResult, RankResult, Results

    ranks = tuple(RankResult.from_json({"finish_ns": 0, **row}) for row in rows)
    layers = {layer: LayerResult.from_json(layer, {"plugin": layer, "summary": summary})
              for layer, summary in (summaries or {}).items()}
    return Results("test", 0, FoldingResult(False, len(ranks), "test"), ranks, layers, warnings, {})


def ring_network(n: int, bandwidth: float = 50.0, latency: float = 500.0, topology: str = "Ring") -> dict[str, Any]:
    """A one-dimensional `network:` section for the `analytical` plugin (distribution
    chakra-sim-network-analytical, which must be installed)."""
    return {"plugin": "analytical", "topology": [topology], "npus_count": [n],
            "bandwidth": [bandwidth], "latency": [latency]}


def hop_ns(size: int, bandwidth: float = 50.0, latency: float = 500.0, hops: int = 1) -> int:
    """ASTRA-sim's congestion-unaware message time."""
    return int(hops * latency + size / (bandwidth * GIB / 1e9))


class PairDelayNetwork:
    """A contention-free network with a given delay per (src, dst) pair plus size // per_byte_divisor;
    usable by every executor (closed form, isolated, message level)."""

    contention_free = True

    def __init__(self, scheduler, delays: dict, per_byte_divisor: int = 7):
        self.scheduler, self.delays, self.divisor = scheduler, delays, per_byte_divisor

    def message_delay(self, src: int, dst: int, size: int) -> int:
        return self.delays[(src, dst)] + size // self.divisor

    def send(self, src, dst, size, on_arrival, arg=None) -> None:
        self.scheduler.schedule(self.message_delay(src, dst, size), on_arrival, arg)


def job_folded_and_unfolded(job: dict[str, Any], tmp_path: Path) -> dict[str, tuple[Any, Any]]:
    """A training job simulated with `workload.fold` auto and off (achievable compute, nccl system):
    fold -> (finish_ns, rank rows); the folded run must have folded and the other not."""
    from chakra_core import run

    out = {}
    for fold in ("auto", "off"):
        data = {"job": job, "workload": {"fold": fold}, "output": {"dir": str(tmp_path / fold)},
                "compute": {"plugin": "achievable"}, "system": {"plugin": "nccl"}}
        document = run.simulate(run.load(data, base_dir=tmp_path)).document
        assert (document["folding"]["folded"] is True) == (fold == "auto")
        out[fold] = (document["finish_ns"], document["ranks"])
    return out


def changed_job(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """A job's sections `base` with `changes` applied (the validation tests' one-change jobs): a
    changed model replaces the model, any other section is updated key by key."""
    data = dict(base)
    for key, value in changes.items():
        data[key] = value if key == "model" else {**data[key], **value}
    return data
