"""From a host trace (and optionally its Kineto trace) to one rank's Chakra .et nodes.

`nodes` emits the nodes (their order and kinds are described there); this module runs the
conversion and completes the dependencies.

Dependencies (see docs/converter.md for the reasoning):

- program order: each host-side node depends on the previous one of its host thread;
  communication is asynchronous, so a COMM node waits for its predecessor but the thread does
  not wait for it;
- launches and streams: a GPU node depends on the CPU node that launched it and on the
  previous GPU node of its stream;
- collectives of one process group run in trace order (the simulator matches the k-th
  collective of a group across ranks);
- data: a node depends on the last writer (before it in program order) of every storage it
  reads; with Kineto, a host-side node does not wait for GPU writers (launches are
  asynchronous) except through synchronisations: a node that called `cudaDeviceSynchronize`,
  `cudaStreamSynchronize`, a blocking `cudaMemcpy`... depends on the last GPU node of every
  stream launched before the call, and its duration loses the time the call waited for the
  GPU (the dependency re-creates that wait; replaying it as CPU work would count it twice);
- nodes with no dependency wait for the METADATA node, so process groups are defined first.
"""

from __future__ import annotations

import bisect
import os
from collections import Counter
from pathlib import Path

from chakra_core.schema import pb
from chakra_core.et.build import metadata
from chakra_core.tools.pytorch import comms
from chakra_core.tools.pytorch.host import HostTrace, load_host_trace
from chakra_core.tools.pytorch.kineto import KinetoTrace, load_kineto_trace
from chakra_core.tools.pytorch.link import link_cpu, link_gpu
from chakra_core.tools.pytorch.nodes import NodeBuilder, node_attr, to_micros
from chakra_core.tools.pytorch.ops import arg_tensors, is_trivial, tensors, written_inputs
from chakra_core.tools.pytorch.result import Conversion, Summary

CONVERTER = "chakra-sim convert pytorch"


def convert(host_path: str | os.PathLike[str], kineto_path: str | os.PathLike[str] | None = None,
            rank: int | None = None) -> Conversion:
    """Convert one rank's traces. `rank` is required when the traces do not say which rank they
    are (unless they hold no communication) and must agree with them when they do."""
    host = load_host_trace(host_path)
    kineto = load_kineto_trace(kineto_path) if kineto_path is not None else None
    return _Converter(host, kineto, rank).run()


class _Converter(NodeBuilder):
    """One rank's conversion: its nodes, their dependencies, its metadata and summary."""

    def __init__(self, host: HostTrace, kineto: KinetoTrace | None, rank: int | None):
        super().__init__(host, kineto, rank)
        self.waits_removed = 0
        self.wait_removed_micros = 0
        self.linked_units = 0                       # units found in the Kineto trace

    # Orchestration ------------------------------------------------------------------------------
    def run(self) -> Conversion:
        units = self.selection.units
        groups = self._process_groups()
        backend_ids = groups.backend_ids()
        for unit in units:
            if unit.comm:
                parts = [self.host.ops[i] for i in unit.absorbed]
                if unit.shadow is not None:
                    parts.append(self.host.ops[unit.shadow])
                self.infos[unit.op.id] = comms.describe(unit.op, parts, backend_ids)
        self._complete_groups(groups)
        self.groups = groups
        self.rank = self._rank()
        if self.kineto is not None:
            self.cpu = link_cpu(self.host, self.kineto)
            self.gpu = link_gpu(self.kineto, self.cpu)
            self.linked_units = linked = sum(1 for u in units if u.op.id in self.cpu.event_of)
            if linked < len(units) / 2:
                self.warnings.append(f"{self.kineto.path}: only {linked} of {len(units)} host operators "
                                     "found in the Kineto trace; is it from the same run?")
        self.metadata_node = self._metadata_node(groups)
        launches = self._launches_by_unit()
        cursor: dict[int, int | None] = {}
        last_collective: dict[str, int] = {}
        for unit in units:
            self._emit_unit(unit, launches.get(unit.op.id, []), cursor, last_collective)
        self._stream_dependencies()
        self._data_dependencies()
        self._blocking_calls()
        if self.metadata_node is not None:
            for node in range(len(self.nodes)):
                if node != self.metadata_node and not self.deps.parents(node):
                    self.deps.control(node, self.metadata_node)
        broken = self.deps.break_cycles()
        for cycle in broken:
            names = " -> ".join(f"{n} ({self.nodes[n].name})" for n in cycle.cycle)
            self.warnings.append(f"dependency cycle broken by dropping node {cycle.dropped[0]}'s "
                                 f"dependency on node {cycle.dropped[1]}: {names}")
        for index, target in enumerate(self.nodes):
            ctrl, data = self.deps.final(index)
            target.ctrl_deps.extend(ctrl)
            target.data_deps.extend(data)
        summary = self._summary(len(broken))
        return Conversion(self.rank, self._global_metadata(), self.nodes, summary)

    # Data and synchronisation dependencies ------------------------------------------------------
    def _data_dependencies(self) -> None:
        """Every reader depends on the last writer of each storage it reads (program order)."""
        last_writer: dict[int, int] = {}
        linked = self.kineto is not None
        for unit in self.selection.units:
            op = unit.op
            host_node, device = self.cpu_node[op.id], list(self.gpu_nodes.get(op.id, []))
            comm = self.comm_node_of.get(op.id)
            if comm is not None and comm != host_node and comm not in device:
                device.append(comm)
            readers = _first_per_stream(self.nodes, device) if device else [host_node]
            for storage in {t.storage_id for t in tensors(op.inputs)}:
                writer = last_writer.get(storage)
                if writer is None:
                    continue
                for reader in readers:
                    if self._may_wait(reader, writer, linked):
                        self.deps.datum(reader, writer)
            if is_trivial(op.name):
                continue
            written = {t.storage_id for t in tensors(op.outputs)}
            for index in written_inputs(op):
                written.update(t.storage_id for t in arg_tensors(op.inputs, index))
            if written:
                writer = max(device, key=lambda n: (self.nodes[n].start_time_micros
                                                   + self.nodes[n].duration_micros, n)) if device else host_node
                for storage in written:
                    last_writer[storage] = writer

    def _may_wait(self, reader: int, writer: int, linked: bool) -> bool:
        if not linked or reader in self.async_nodes:
            return True
        if writer in self.async_nodes:   # launched work: the host waits only if it synchronises
            return self.nodes[writer].type != pb.COMP_NODE and node_attr(self.nodes[writer], "stream") is None
        return self.thread_of.get(writer) != self.thread_of.get(reader)

    def _stream_dependencies(self) -> None:
        """A stream runs its work in the order the GPU started it."""
        for queue in self.stream_nodes.values():
            ordered = sorted(queue, key=lambda item: (item[1], item[2]))
            for (_, _, before), (_, _, after) in zip(ordered, ordered[1:]):
                self.deps.control(after, before)

    def _blocking_calls(self) -> None:
        """A host operator that blocked until GPU work (or a collective) finished depends on the
        last GPU node of every stream launched before the call, and keeps only its own cost: the
        run re-creates the wait through that dependency, and replaying the measured span as CPU
        work would count the wait twice."""
        if self.gpu is None:
            return
        streams = {s: sorted((launch, node) for launch, _, node in q) for s, q in self.stream_nodes.items()}
        waited: dict[int, float] = {}
        for call in self.gpu.blocking:
            unit = self._unit_for(call.host_id, call.ts)
            if unit is None:
                continue
            waiter = self.cpu_node[unit.op.id]
            for queue in streams.values():
                position = bisect.bisect_right(queue, (call.ts, float("inf"))) - 1
                while position >= 0 and self.unit_of_node.get(queue[position][1]) == unit.op.id:
                    position -= 1   # its own launches come after it in the graph
                if position >= 0:
                    self.deps.datum(waiter, queue[position][1])
            if call.wait > 0:
                waited[waiter] = waited.get(waiter, 0.0) + call.wait
                self.waits_removed += 1
        for node, micros in sorted(waited.items()):
            target = self.nodes[node]
            cut = min(target.duration_micros, to_micros(micros))
            target.duration_micros -= cut
            self.wait_removed_micros += cut

    # Output --------------------------------------------------------------------------------------
    def _global_metadata(self) -> pb.GlobalMetadata:
        host_meta = self.host.meta
        attrs: dict[str, object] = {"schema": self.host.schema}
        for key in ("pid", "start_ts", "finish_ts"):
            if isinstance(host_meta.get(key), int):
                attrs[key] = int(host_meta[key])   # int(): a JSON boolean stays an integer attribute
        if isinstance(host_meta.get("time"), str):
            attrs["time"] = host_meta["time"]
        attrs["converter"] = CONVERTER
        attrs["host_trace"] = Path(self.host.path).name
        if self.kineto is not None:
            attrs["kineto_trace"] = Path(self.kineto.path).name
        attrs["rank"] = self.rank
        world_size = self.groups.job_size()
        if world_size:
            attrs["world_size"] = world_size
        return metadata(attrs)

    def _summary(self, cycles: int) -> Summary:
        counts: Counter[str] = Counter()
        collectives: Counter[str] = Counter()
        cpu = gpu = comm = num_ops = 0
        for node in self.nodes:
            name = pb.NodeType.Name(node.type)
            if node.type == pb.COMP_NODE:
                on_cpu = node_attr(node, "is_cpu_op")
                name += " (cpu)" if on_cpu else " (gpu)"
                if on_cpu:
                    cpu += node.duration_micros
                else:
                    gpu += node.duration_micros
                num_ops += node_attr(node, "num_ops") or 0
            elif node.type in (pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
                comm += node.duration_micros
                kind = node_attr(node, "comm_type")
                collectives[pb.CollectiveCommType.Name(kind) if kind is not None
                            else "SEND" if node.type == pb.COMM_SEND_NODE else "RECV"] += 1
            counts[name] += 1
        ctrl, data = self.deps.edge_counts()
        summary = Summary(self.host.path, self.kineto.path if self.kineto else None, self.rank,
                          self.host.schema, dict(sorted(counts.items())), ctrl, data,
                          dict(sorted(collectives.items())), len(self.selection.units),
                          cpu_micros=cpu, gpu_micros=gpu, comm_micros=comm, num_ops=num_ops,
                          cycles_broken=cycles, waits_removed=self.waits_removed,
                          wait_removed_micros=self.wait_removed_micros, warnings=self.warnings, notes=self.notes)
        if self.cpu is not None:
            assert self.gpu is not None     # linked together with self.cpu
            summary.linked = self.linked_units
            summary.linked_by_rf_id = sum(1 for u in self.selection.units
                                          if u.op.id in self.cpu.event_of and self.cpu.event_of[u.op.id].rf_id == u.op.rf_id
                                          and u.op.rf_id is not None)
            summary.gpu_events = len(self.gpu.launches)
            summary.gpu_linked = self.gpu_linked
        return summary


def _first_per_stream(nodes: list[pb.Node], indices: list[int]) -> list[int]:
    seen, first = set(), []
    for index in indices:
        stream = node_attr(nodes[index], "stream")
        if stream not in seen:
            seen.add(stream)
            first.append(index)
    return first
