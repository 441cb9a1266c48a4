"""Helpers for testing plugins: build small traces, run a manifest in-process, get the results.

A plugin's own test suite needs only chakra-sim installed::

    from chakra_core.testing import collective, manifest, simulate, uniform_network, write_ranks
    from chakra_core.schema import pb

    def test_all_reduce(tmp_path):
        prefix = write_ranks(tmp_path, [[collective(1, pb.ALL_REDUCE, 1 << 20)]] * 4)
        results = simulate(manifest(prefix, uniform_network(4)))
        assert results["finish_ns"] > 0

- Nodes: `make_node` (any type, typed attributes), and the shortcuts `comp`,
  `collective`, `send`, `recv`; `write_et` / `write_ranks` write them as
  Chakra .et files (`<prefix>.<rank>.et`).
- `manifest(...)` builds a manifest mapping; `simulate(...)` validates and
  runs it with your in-process plugins (`extra_plugins=[(name, obj)]`) and
  returns the results document (what results.json would hold).
- `EventQueue()`: the engine's scheduler, to build a layer by hand as
  `MyModel(config, LayerContext(num_ranks, EventQueue()))` and drive it.
- `uniform_network(n)` selects `testing_uniform`, a contention-free network
  that `simulate` always registers, so a compute or memory plugin can be
  tested without installing a network plugin.

pytest fixtures built on these (`chakra_trace`, `chakra_run`, `chakra_host`,
`chakra_installed`) come with chakra-sim as a pytest plugin
(chakra_core.pytest_plugin): a plugin's tests use them without a conftest.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from pydantic import NonNegativeInt, PositiveFloat, PositiveInt

from chakra_core.contract.hookspecs import hookimpl
from chakra_core.plugins import PluginHost, make_plugin_host
from chakra_core.contract.inputs import LayerContext
from chakra_core.contract.layers import PluginConfig
from chakra_core.contract.network import Dimension, NetworkModel
from chakra_core.contract.registry import NetworkRegistry
from chakra_core.engine.events import EventQueue
from chakra_core.et.io import write_trace
from chakra_core.json_types import JsonObject, JsonValue
from chakra_core.run import load
from chakra_core.run import simulate as simulate_run
from chakra_core.schema import pb

__all__ = ["make_attr", "make_node", "make_metadata", "write_et", "write_ranks", "comp", "collective",
           "send", "recv", "manifest", "simulate", "testing_host", "uniform_network", "UniformNetwork",
           "TESTING_PLUGIN", "GIB", "EventQueue"]

GIB = 1 << 30

# Nodes and traces -----------------------------------------------------------------------------------
_LIST_FIELDS = {bool: "bool_list", int: "int64_list", float: "double_list", str: "string_list",
                bytes: "bytes_list"}


def make_attr(name: str, value: Any) -> pb.AttributeProto:
    """An AttributeProto. `value` is an AttributeProto field given as `("uint64_val", 5)`, or a
    Python value whose type picks the field: bool, int (int64), float (double), str, bytes, or a
    non-empty list of one of those (`*_list`)."""
    attr = pb.AttributeProto(name=name)
    if isinstance(value, tuple):
        field, val = value
        if field.endswith("_list"):
            getattr(attr, field).values.extend(val)
        else:
            setattr(attr, field, val)
    elif isinstance(value, bool):
        attr.bool_val = value
    elif isinstance(value, int):
        attr.int64_val = value
    elif isinstance(value, float):
        attr.double_val = value
    elif isinstance(value, str):
        attr.string_val = value
    elif isinstance(value, bytes):
        attr.bytes_val = value
    elif isinstance(value, list) and value:
        getattr(attr, _LIST_FIELDS[type(value[0])]).values.extend(value)
    else:
        raise TypeError(f"cannot infer the attribute field of {name}={value!r}; pass (field, value)")
    return attr


def make_node(id: int, type: "pb.NodeType | str" = pb.COMP_NODE, data_deps: Iterable[int] = (),
              ctrl_deps: Iterable[int] = (), attrs: Mapping[str, Any] | None = None,
              duration_micros: int = 0, name: str | None = None) -> pb.Node:
    """A Node; `type` is a NodeType value or name, `attrs` maps names to `make_attr` values."""
    node = pb.Node(id=id, name=f"node{id}" if name is None else name,
                   type=type,   # protobuf takes a NodeType or its name
                   duration_micros=duration_micros)
    node.data_deps.extend(data_deps)
    node.ctrl_deps.extend(ctrl_deps)
    for attr_name, value in (attrs or {}).items():
        node.attr.append(make_attr(attr_name, value))
    return node


def make_metadata(version: str = "0.0.4", attrs: Mapping[str, Any] | None = None) -> pb.GlobalMetadata:
    """The GlobalMetadata message every .et file starts with."""
    meta = pb.GlobalMetadata(version=version)
    for attr_name, value in (attrs or {}).items():
        meta.attr.append(make_attr(attr_name, value))
    return meta


def write_et(path: str | os.PathLike[str], nodes: Iterable[pb.Node],
             metadata: pb.GlobalMetadata | None = None, compress: bool = False) -> Path:
    """Write nodes (after a default GlobalMetadata) to a .et file; return the path."""
    write_trace(path, make_metadata() if metadata is None else metadata, nodes, compress=compress)
    return Path(path)


def write_ranks(folder: str | os.PathLike[str], ranks: Sequence[Iterable[pb.Node]], name: str = "trace") -> str:
    """Write `<folder>/<name>.<rank>.et`, one per list of nodes in `ranks`; return the prefix
    (what a manifest's `workload.trace` takes)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for rank, nodes in enumerate(ranks):
        write_et(folder / f"{name}.{rank}.et", list(nodes))
    return str(folder / name)


def comp(node_id: int, micros: int, deps: Iterable[int] = (), **attrs: Any) -> pb.Node:
    """A COMP_NODE lasting `micros` µs when replayed; `attrs` such as num_ops=, tensor_size=,
    is_cpu_op=True."""
    return make_node(node_id, pb.COMP_NODE, data_deps=deps, duration_micros=micros, attrs=attrs)


def collective(node_id: int, comm_type: int, size: int, deps: Iterable[int] = (), **attrs: Any) -> pb.Node:
    """A COMM_COLL_NODE: `comm_type` is a `pb.CollectiveCommType` value (pb.ALL_REDUCE ...),
    `size` its comm_size in bytes; `attrs` such as pg_name="tp", root_rank=0."""
    return make_node(node_id, pb.COMM_COLL_NODE, data_deps=deps,
                     attrs={"comm_type": comm_type, "comm_size": size, **attrs})


def send(node_id: int, dst: int, size: int, tag: int = 0, deps: Iterable[int] = (), **attrs: Any) -> pb.Node:
    """A COMM_SEND_NODE of `size` bytes to rank `dst`; it matches the `recv` with the same tag."""
    return make_node(node_id, pb.COMM_SEND_NODE, data_deps=deps,
                     attrs={"comm_dst": dst, "comm_size": size, "comm_tag": tag, **attrs})


def recv(node_id: int, src: int, size: int, tag: int = 0, deps: Iterable[int] = (), **attrs: Any) -> pb.Node:
    """A COMM_RECV_NODE of `size` bytes from rank `src`."""
    return make_node(node_id, pb.COMM_RECV_NODE, data_deps=deps,
                     attrs={"comm_src": src, "comm_size": size, "comm_tag": tag, **attrs})


# A network for tests ----------------------------------------------------------------------------------
class UniformConfig(PluginConfig):
    npus: PositiveInt
    bandwidth_gbps: PositiveFloat = 50.0
    latency_ns: NonNegativeInt = 500


class UniformNetwork(NetworkModel):
    """One switch: a message takes `latency_ns + size / bandwidth` (GB = 2^30 bytes, like every
    network's `dims`), whatever else is in flight."""

    name = "testing_uniform"
    fidelity = ("for tests: every message takes latency_ns + size / bandwidth_gbps "
                "(one switch, no contention)")
    Config = UniformConfig
    contention_free = True
    fold_safe = True

    def __init__(self, config: UniformConfig, context: LayerContext):
        super().__init__(config, context)
        self.npus_count = config.npus
        self.dims = (Dimension("Switch", config.npus, config.bandwidth_gbps, float(config.latency_ns)),)
        self._bytes_per_ns = config.bandwidth_gbps * GIB / 1e9

    def message_delay(self, src: int, dst: int, size: int) -> int:
        latency: int = self.config.latency_ns
        return latency + int(size / self._bytes_per_ns)

    def send(self, src: int, dst: int, size: int, on_arrival: Callable[[Any], None], arg: Any = None) -> None:
        self.context.scheduler.schedule(self.message_delay(src, dst, size), on_arrival, arg)


class _TestingPlugin:
    @hookimpl
    def chakra_sim_register_network(self, registry: NetworkRegistry) -> None:
        registry.add(UniformNetwork)


TESTING_PLUGIN = ("chakra-sim-testing", _TestingPlugin())
"""(name, plugin) pair that `simulate` registers: it provides the `testing_uniform` network."""


# Manifests and runs ---------------------------------------------------------------------------------
def uniform_network(npus: int, bandwidth_gbps: float = 50.0, latency_ns: int = 500) -> JsonObject:
    """A manifest `network:` section selecting `testing_uniform` (see `UniformNetwork`)."""
    return {"plugin": UniformNetwork.name, "npus": npus, "bandwidth_gbps": bandwidth_gbps,
            "latency_ns": latency_ns}


def manifest(prefix: str, network: JsonObject | None, system: JsonObject | None = None,
             compute: JsonObject | None = None, memory: JsonObject | None = None,
             **workload: JsonValue) -> JsonObject:
    """A manifest mapping: `workload.trace` is `prefix`, `workload` keywords go to the workload
    section (resources=, comm_groups=, feeder= ...). `system` holds native system-layer keys
    (its `plugin` is `native`); `compute` and `memory` are whole sections, `plugin` included."""
    data: JsonObject = {"workload": {"trace": prefix, **workload}}
    if network is not None:   # a system layer that times communication itself needs none
        data["network"] = network
    if system is not None:
        data["system"] = {"plugin": "native", **system}
    if compute is not None:
        data["compute"] = compute
    if memory is not None:
        data["memory"] = memory
    return data


def testing_host(extra_plugins: Iterable[tuple[str, Any]] = ()) -> PluginHost:
    """A fresh plugin host: the installed plugins, `TESTING_PLUGIN`, then `extra_plugins`
    ((name, plugin object or module) pairs; one already installed is not registered twice)."""
    return make_plugin_host(extra_plugins=[TESTING_PLUGIN, *extra_plugins])


def simulate(data: Mapping[str, JsonValue], base_dir: str | os.PathLike[str] | None = None,
             extra_plugins: Iterable[tuple[str, Any]] = (), host: PluginHost | None = None) -> JsonObject:
    """Validate a manifest mapping and run it; return the results document.

    `extra_plugins` are (name, plugin object or module) pairs registered after the installed
    plugins and `TESTING_PLUGIN`; `host` replaces that plugin host altogether. Relative paths
    resolve against `base_dir` (default: the current directory). Raises what a run raises:
    `ManifestError`, `PluginError`, `SimulationError`.
    """
    if host is None:
        host = testing_host(extra_plugins)
    config = load(data, host, base_dir=Path(base_dir) if base_dir is not None else Path.cwd(), name="test")
    return simulate_run(config, host, timeline=False).document   # as results.json holds it
