"""Running small simulations from node lists, for engine and system-layer tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Sequence

from chakra_core.engine.simulation import Simulation
from chakra_core.manifest import build_manifest
from chakra_core.plugins import make_plugin_host
from chakra_core.schema import pb
from tests.helpers import make_node, write_et

DATA = Path(__file__).resolve().parent / "data"
MICRO = DATA / "astra-microbenchmarks"

GIB = 1 << 30


def ring_network(n: int, bandwidth: float = 50.0, latency: float = 500.0, topology: str = "Ring") -> dict:
    return {"plugin": "analytical", "topology": [topology], "npus_count": [n],
            "bandwidth": [bandwidth], "latency": [latency]}


def write_ranks(folder: Path, ranks: Sequence[Iterable[pb.Node]], name: str = "trace") -> str:
    """Write one .et per rank; return the prefix."""
    folder.mkdir(parents=True, exist_ok=True)
    for rank, nodes in enumerate(ranks):
        write_et(folder / f"{name}.{rank}.et", list(nodes))
    return str(folder / name)


def manifest(prefix: str, network: dict, system: dict | None = None, compute: dict | None = None,
             memory: dict | None = None, **workload: Any) -> dict:
    data: dict[str, Any] = {"workload": {"trace": prefix, **workload}, "network": network}
    if system is not None:
        data["system"] = {"plugin": "native", **system}
    if compute is not None:
        data["compute"] = compute
    if memory is not None:
        data["memory"] = memory
    return data


def simulate(data: dict, base_dir: Path | None = None, extra_plugins=(), host=None) -> dict:
    """Validate a manifest mapping and run it; return the results document."""
    host = host or make_plugin_host(extra_plugins=extra_plugins)
    loaded = build_manifest(data, host, base_dir=base_dir or Path.cwd(), source="test")
    return Simulation(loaded.spec, host).run()


def collective(node_id: int, comm_type: int, size: int, deps: Iterable[int] = (), **attrs: Any) -> pb.Node:
    return make_node(node_id, pb.COMM_COLL_NODE, data_deps=deps,
                     attrs={"comm_type": comm_type, "comm_size": size, **attrs})


def comp(node_id: int, micros: int, deps: Iterable[int] = (), **attrs: Any) -> pb.Node:
    return make_node(node_id, pb.COMP_NODE, data_deps=deps, duration_micros=micros, attrs=attrs)


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
