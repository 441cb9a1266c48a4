"""From a host trace (and optionally its Kineto trace) to one rank's Chakra .et nodes.

Node ids are dense and follow program order: an optional METADATA node (process groups)
first, then each unit (see units.py) in host id order, each followed by the GPU work it
launched in start order. The simulator issues ready nodes smallest id first, so this order
is also its tie-break.

Without Kineto, each unit is one node: a COMP node (`is_cpu_op` false when it works on device
tensors and is not a view/allocation, so a compute model can time it from `num_ops`), or a
COMM node. With Kineto, each unit is a CPU COMP node with its measured duration; its kernels
and copies are GPU COMP nodes on their streams, and an NCCL kernel becomes the communication
node (communication without a kernel, as with gloo, is a node of its own).

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
from dataclasses import dataclass, field
from pathlib import Path

from chakra_core.et.attrs import attr_value
from chakra_core.et.dtypes import operands_dtype
from chakra_core.et.io import write_trace
from chakra_core.schema import pb
from chakra_core.tools._build import (bool_attr, int_attr, metadata, process_group_json, rank_path, str_attr,
                                      uint_attr)
from chakra_core.tools.pytorch import comms
from chakra_core.tools.pytorch.comms import CommInfo, Group, ProcessGroups
from chakra_core.tools.pytorch.deps import Dependencies
from chakra_core.tools.pytorch.errors import ConversionError
from chakra_core.tools.pytorch.host import HostOp, HostTrace, load_host_trace
from chakra_core.tools.pytorch.kineto import Event, KinetoTrace, load_kineto_trace
from chakra_core.tools.pytorch.link import CpuLinks, GpuLinks, Launch, link_cpu, link_gpu
from chakra_core.tools.pytorch.ops import (Estimate, arg_tensors, estimate, is_operator, is_trivial,
                                           operand_bytes, tensors, written_inputs)
from chakra_core.tools.pytorch.units import Selection, Unit, select_units

CONVERTER = "chakra-sim convert pytorch"


@dataclass
class Summary:
    host: str
    kineto: str | None
    rank: int
    schema: str
    nodes: dict[str, int]
    ctrl_edges: int
    data_edges: int
    collectives: dict[str, int]
    units: int
    linked: int = 0
    linked_by_rf_id: int = 0
    gpu_events: int = 0
    gpu_linked: int = 0
    cpu_micros: int = 0
    gpu_micros: int = 0
    comm_micros: int = 0
    num_ops: int = 0
    cycles_broken: int = 0
    waits_removed: int = 0
    """Blocking runtime calls whose wait for the GPU was taken out of their operator's duration."""
    wait_removed_micros: int = 0
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def edges(self) -> int:
        return self.ctrl_edges + self.data_edges

    @property
    def unlinked(self) -> int:
        return self.units - self.linked if self.kineto else 0


@dataclass
class Conversion:
    rank: int
    metadata: pb.GlobalMetadata
    nodes: list[pb.Node]
    summary: Summary

    def write(self, prefix: str | os.PathLike) -> Path:
        """Write PREFIX.<rank>.et (atomically; identical input gives identical bytes)."""
        path = rank_path(prefix, self.rank)
        write_trace(path, self.metadata, self.nodes)
        return path


def convert(host_path: str | os.PathLike, kineto_path: str | os.PathLike | None = None,
            rank: int | None = None) -> Conversion:
    """Convert one rank's traces. `rank` is required when the traces do not say which rank they
    are (unless they hold no communication) and must agree with them when they do."""
    host = load_host_trace(host_path)
    kineto = load_kineto_trace(kineto_path) if kineto_path is not None else None
    return _Converter(host, kineto, rank).run()


class _Converter:
    def __init__(self, host: HostTrace, kineto: KinetoTrace | None, rank: int | None):
        self.host, self.kineto, self.requested_rank = host, kineto, rank
        self.warnings: list[str] = list(host.warnings) + (list(kineto.warnings) if kineto else [])
        self.notes: list[str] = []
        self.selection: Selection = select_units(host)
        self.warnings.extend(self.selection.warnings)
        self.deps = Dependencies()
        self.nodes: list[pb.Node] = []
        self.cpu_node: dict[int, int] = {}          # unit op id -> its host-side node
        self.gpu_nodes: dict[int, list[int]] = {}   # unit op id -> its GPU nodes (launch order)
        self.async_nodes: set[int] = set()          # nodes the host thread does not wait for
        self.thread_of: dict[int, int] = {}         # host-side node -> host thread
        self.stream_nodes: dict[int, list[tuple[float, float, int]]] = {}  # stream -> (launch ts, start, node)
        self.unit_of_node: dict[int, int] = {}      # node -> unit op id
        self.comm_node_of: dict[int, int] = {}      # unit op id -> its communication node
        self.gpu_linked = 0
        self.waits_removed = 0
        self.wait_removed_micros = 0
        self.linked_units = 0                       # units found in the Kineto trace
        self.infos: dict[int, CommInfo] = {}        # communication unit op id -> what it does
        self.cpu: CpuLinks | None = None
        self.gpu: GpuLinks | None = None

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
        for index, node in enumerate(self.nodes):
            ctrl, data = self.deps.final(index)
            node.ctrl_deps.extend(ctrl)
            node.data_deps.extend(data)
        summary = self._summary(len(broken))
        return Conversion(self.rank, self._global_metadata(), self.nodes, summary)

    # Process groups and rank --------------------------------------------------------------------
    def _process_groups(self) -> ProcessGroups:
        groups = ProcessGroups()
        for op in self.selection.pg_inits:
            for value in op.inputs.values:
                groups.add_entries(value, f"{self.host.path}: {op.label()}", self.warnings)
        for op in self.selection.process_ops:
            if "pg_config" in op.attrs:
                groups.add_entries(op.attrs["pg_config"], f"{self.host.path}: {op.label()}", self.warnings)
        if self.kineto is not None:
            if "pg_config" in self.kineto.distributed:
                groups.add_entries(self.kineto.distributed["pg_config"],
                                   f"{self.kineto.path}: distributedInfo", self.warnings)
            groups.world_size = self.kineto.world_size
        return groups

    def _complete_groups(self, groups: ProcessGroups) -> None:
        """Groups only the communication operators describe, and collectives in unknown groups."""
        for op_id, info in self.infos.items():
            if info.pg_name is None:
                continue
            if info.group_ranks and (info.pg_name not in groups.groups or not groups.groups[info.pg_name].ranks):
                groups.add(Group(info.pg_name, info.group_ranks, len(info.group_ranks)))
            elif info.pg_name not in groups.groups and info.pg_name != "0":
                self.warnings.append(f"{self.host.path}: {self.host.ops[op_id].label()}: process group "
                                     f"{info.pg_name!r} is not defined in the traces; it is treated "
                                     "as every rank")
                groups.add(Group(info.pg_name, []))
        size = groups.job_size()
        if size and size > 1:
            spanning = [name for name, g in sorted(groups.groups.items()) if groups.spans_job(g)]
            if spanning:
                self.notes.append(f"process group(s) {', '.join(spanning)} span the whole job ({size} "
                                  "ranks): written as 'every rank of the simulated run', so a "
                                  "simulation of fewer ranks runs them among the ranks present")
            elif any(i.pg_name is None for i in self.infos.values()):
                self.notes.append(f"the job had {size} ranks; collectives without a process group run "
                                  "among every rank of the simulated run")

    def _rank(self) -> int:
        """The rank the traces record; --rank only fills in for traces that record none (and must
        agree with them); a trace without any rank or communication is a one-rank job (rank 0)."""
        found: list[tuple[int, str]] = []
        if self.kineto is not None and self.kineto.rank is not None:
            found.append((self.kineto.rank, f"{self.kineto.path} (distributedInfo.rank)"))
        host_rank, where = self.host.meta.get("rank"), "top-level 'rank'"
        for op in self.selection.process_ops:
            if "rank" in op.attrs:
                host_rank, where = op.attrs["rank"], f"{op.label()} 'rank' attribute"
        if not isinstance(host_rank, int) or isinstance(host_rank, bool):
            votes = Counter(i.rank for i in self.infos.values() if i.rank is not None)
            host_rank, where = (votes.most_common(1)[0][0] if votes else None), "record_param_comms"
        if isinstance(host_rank, int) and not isinstance(host_rank, bool):
            found.append((host_rank, f"{self.host.path} ({where})"))
        if found:
            rank, source = found[0]
            for other, place in found[1:]:
                if other != rank:
                    self.warnings.append(f"{place} says rank {other} but {source} says {rank}; "
                                         f"using {rank}")
            if self.requested_rank is not None and self.requested_rank != rank:
                raise ConversionError(f"--rank {self.requested_rank} contradicts {source}, which says "
                                      f"rank {rank}: drop --rank, or convert that rank's own trace")
            return rank
        if self.requested_rank is not None:
            return self.requested_rank
        size = self.groups.job_size()
        if not self.infos and (size or 1) == 1:
            self.notes.append("the trace records no rank and no communication: a one-rank job, "
                              "written as rank 0")
            return 0
        job = f"a {size}-rank job" if size else "a job with communication"
        kineto = "its Kineto trace has no distributedInfo.rank" if self.kineto is not None \
            else "no Kineto trace was given"
        raise ConversionError(f"{self.host.path}: the trace is one rank of {job} but does not say which "
                              f"(no rank in record_param_comms or a 'rank' field; {kineto}): give it "
                              "with --rank N")

    def _group_size(self, pg_name: str | None) -> int | None:
        """Members of a process group from its definition (unnamed: the job's default group)."""
        group = self.groups.groups.get(pg_name if pg_name is not None else "0")
        if group is not None and (group.size or group.ranks):
            return group.size or len(group.ranks)
        return self.groups.job_size()

    def _metadata_node(self, groups: ProcessGroups) -> int | None:
        used = {info.pg_name for info in self.infos.values() if info.pg_name is not None}
        entries = groups.entries(used)
        unused = sorted(set(groups.groups) - used)
        if unused:
            self.notes.append(f"process group(s) {', '.join(unused)} defined but not used by this "
                              "rank's collectives: not written")
        if not entries:
            return None
        index = self._new_node("process_groups", pb.METADATA_NODE, [])
        self.nodes[index].inputs.values = process_group_json(entries)
        return index

    # Nodes ---------------------------------------------------------------------------------------
    def _new_node(self, name: str, node_type: int, attrs: list[pb.AttributeProto],
                  duration: float = 0.0, start: float = 0.0) -> int:
        index = self.deps.add_node()
        self.nodes.append(pb.Node(id=index, name=name, type=node_type, attr=attrs,
                                  duration_micros=_micros(duration), start_time_micros=_micros(start)))
        return index

    def _launches_by_unit(self) -> dict[int, list]:
        """Unit op id -> the GPU work it launched (start order)."""
        by_unit: dict[int, list] = {}
        if self.gpu is None:
            return by_unit
        for launch in self.gpu.launches:
            unit = self._unit_for(launch.host_id, launch.launch_ts)
            if unit is not None:
                by_unit.setdefault(unit.op.id, []).append(launch)
                self.gpu_linked += 1
        return by_unit

    def _unit_for(self, host_id: int | None, ts: float) -> Unit | None:
        """The unit that represents a host scope at time `ts` (a scope represented by its
        children: the last of its units that started by then, else its first)."""
        if host_id is None:
            return None
        unit = self.selection.unit_of.get(host_id)
        if unit is not None:
            return unit
        below = self.selection.units_under(host_id)
        started = [u for u in below if (e := self.cpu.event_of.get(u.op.id)) is not None and e.ts <= ts]
        return started[-1] if started else (below[0] if below else None)

    def _emit_unit(self, unit: Unit, launches: list[Launch], cursor: dict, last_collective: dict) -> None:
        """The nodes of one unit: its host-side node, the GPU work it launched, its communication."""
        op, info = unit.op, self.infos.get(unit.op.id)
        event = self.cpu.event_of.get(op.id) if self.cpu is not None else None
        flops = estimate(op)
        if flops.problem:
            self.warnings.append(f"{self.host.path}: {op.label()}: {flops.problem}; no FLOP estimate "
                                 "(duration only)")
        if info is not None and self.kineto is None:   # host only: the operator is its communication
            node = comm_node = self._comm_node(op, info, None, None)
            self._host_side(node, unit, cursor, advance=False)
        else:
            node, comm_node = self._host_node(op, info, event, flops), None
            self._host_side(node, unit, cursor, advance=True)
        gpu_nodes = self.gpu_nodes.setdefault(op.id, [])
        for launch in launches:
            kernel = launch.event
            if info is not None and kernel.name.lower().startswith("nccl"):
                if comm_node is None:
                    comm_node = self._comm_node(op, info, kernel, None)
                    self._gpu_side(comm_node, unit, launch, gpu_nodes)
                else:   # one communication node per operator: later NCCL kernels extend it
                    self._extend(comm_node, kernel)
                continue
            self._gpu_side(self._gpu_node(op, kernel), unit, launch, gpu_nodes)
        if info is not None and comm_node is None:   # communication without a kernel (gloo, unlinked)
            shadow = self.cpu.event_of.get(unit.shadow) if unit.shadow is not None else None
            comm_node = self._comm_node(op, info, None, shadow or event)
            self.deps.control(comm_node, node)
            self.unit_of_node[comm_node] = op.id
            self.async_nodes.add(comm_node)
        if comm_node is not None:
            self.comm_node_of[op.id] = comm_node
            group = info.pg_name or ""
            self.deps.control(comm_node, last_collective.get(group))
            last_collective[group] = comm_node
        work = {"num_ops": flops.num_ops, "tensor_size": operand_bytes(op.inputs) + operand_bytes(op.outputs)}
        self._place_work(node, [] if info is not None else gpu_nodes, work)

    def _host_node(self, op: HostOp, info: CommInfo | None, event: Event | None, flops: Estimate) -> int:
        """A COMP node for a host operator. Host only, an operator on device tensors stands for
        its device work (`is_cpu_op` false) unless it only re-views or allocates."""
        operator, trivial = is_operator(op), is_trivial(op.name)
        on_device = self.kineto is None and operator and not trivial and any(
            not t.on_host for t in tensors(op.inputs) + tensors(op.outputs))
        if info is not None:
            family = "communication"
        elif trivial:
            family = "view"
        else:
            family = flops.family if operator else "label"
        attrs = [bool_attr("is_cpu_op", not on_device), str_attr("op_type", family), *_host_attrs(op)]
        return self._new_node(op.name, pb.COMP_NODE, attrs, event.dur if event else 0, event.ts if event else 0)

    def _gpu_node(self, op: HostOp, kernel: Event) -> int:
        attrs = [bool_attr("is_cpu_op", False), str_attr("op_type", _gpu_family(kernel)),
                 int_attr("stream", kernel.stream if kernel.stream is not None else 0),
                 int_attr("host_op_id", op.id)]
        if isinstance(kernel.args.get("bytes"), int) and kernel.args["bytes"] >= 0:
            attrs.append(uint_attr("tensor_size", kernel.args["bytes"]))
        return self._new_node(kernel.name, pb.COMP_NODE, attrs, kernel.dur, kernel.ts)

    def _host_side(self, node: int, unit: Unit, cursor: dict, advance: bool) -> None:
        """Program order on the unit's thread; `advance` false for asynchronous communication."""
        op, thread = unit.op, unit.thread
        self.deps.control(node, cursor.get(thread))
        if advance:
            cursor[thread] = node
        else:
            self.async_nodes.add(node)
        self.cpu_node[op.id] = node
        self.thread_of[node] = thread
        self.unit_of_node[node] = op.id
        target = self.nodes[node]
        for io, operands in ((target.inputs, op.inputs), (target.outputs, op.outputs)):
            if operands.values:
                io.values, io.shapes, io.types = repr(operands.values), repr(operands.shapes), repr(operands.types)

    def _gpu_side(self, node: int, unit: Unit, launch, gpu_nodes: list[int]) -> None:
        kernel = launch.event
        self.deps.control(node, self.cpu_node[unit.op.id])
        stream = kernel.stream if kernel.stream is not None else -1
        self.stream_nodes.setdefault(stream, []).append((launch.launch_ts, kernel.ts, node))
        gpu_nodes.append(node)
        self.unit_of_node[node] = unit.op.id
        self.async_nodes.add(node)

    def _extend(self, node: int, kernel: Event) -> None:
        target = self.nodes[node]
        end = max(target.start_time_micros + target.duration_micros, _micros(kernel.end))
        target.duration_micros = end - target.start_time_micros

    def _comm_node(self, op: HostOp, info: CommInfo, kernel: Event | None, event: Event | None) -> int:
        node_type = comms.node_type_of(info.kind)
        attrs = [bool_attr("is_cpu_op", False), str_attr("op_type", "communication")]
        if node_type == pb.COMM_COLL_NODE:
            attrs.append(int_attr("comm_type", info.kind))
        size, problem = comms.comm_size(info, info.group_size or self._group_size(info.pg_name))
        if problem:
            self.warnings.append(f"{self.host.path}: {op.label()}: {problem}")
        attrs.append(uint_attr("comm_size", max(0, size)))
        if info.pg_name is not None:
            attrs.append(str_attr("pg_name", info.pg_name))
        if info.kind in comms.ROOTED and info.root is not None:
            attrs.append(int_attr("root_rank", self.groups.global_rank(info.pg_name, info.root)))
        if node_type != pb.COMM_COLL_NODE:
            peer = self.groups.global_rank(info.pg_name, info.peer) if info.peer is not None else None
            if peer is None:
                self.warnings.append(f"{self.host.path}: {op.label()}: the peer rank of this "
                                     f"{comms.type_name(info.kind).lower()} is not in the trace; "
                                     "the node cannot be simulated")
            src, dst = (self.rank, peer) if node_type == pb.COMM_SEND_NODE else (peer, self.rank)
            if src is not None:
                attrs.append(int_attr("comm_src", src))
            if dst is not None:
                attrs.append(int_attr("comm_dst", dst))
            attrs.append(int_attr("comm_tag", info.tag or 0))
        if kernel is not None:
            attrs.append(int_attr("stream", kernel.stream if kernel.stream is not None else 0))
        attrs.append(int_attr("host_op_id", op.id))
        timed = kernel or event
        name = kernel.name if kernel is not None else op.name
        return self._new_node(name, node_type, attrs, timed.dur if timed else 0, timed.ts if timed else 0)

    def _place_work(self, cpu_node: int, gpu_nodes: list[int], work: dict) -> None:
        """num_ops / tensor_size go to the longest compute kernel when there is one (what a
        compute model times), else to the host-side node (communication: always there)."""
        kernels = [n for n in gpu_nodes if self.nodes[n].type == pb.COMP_NODE
                   and _attr(self.nodes[n], "op_type") == "kernel"]
        target = self.nodes[max(kernels, key=lambda n: (self.nodes[n].duration_micros, -n))] if kernels \
            else self.nodes[cpu_node]
        if target.type != pb.COMP_NODE:
            return
        if work["num_ops"] is not None:
            target.attr.append(uint_attr("num_ops", max(0, work["num_ops"])))
            host = self.nodes[cpu_node]
            dtype = operands_dtype(host.inputs.types, host.inputs.shapes) if target is not host else None
            if dtype is not None:   # the kernel has no operands of its own to say what it computes in
                target.attr.append(str_attr("dtype", dtype))
        if work["tensor_size"] > 0 and _attr(target, "tensor_size") is None:
            target.attr.append(uint_attr("tensor_size", work["tensor_size"]))

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
            return self.nodes[writer].type != pb.COMP_NODE and _attr(self.nodes[writer], "stream") is None
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
            cut = min(target.duration_micros, _micros(micros))
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
        counts: Counter = Counter()
        collectives: Counter = Counter()
        cpu = gpu = comm = num_ops = 0
        for node in self.nodes:
            name = pb.NodeType.Name(node.type)
            if node.type == pb.COMP_NODE:
                on_cpu = _attr(node, "is_cpu_op")
                name += " (cpu)" if on_cpu else " (gpu)"
                if on_cpu:
                    cpu += node.duration_micros
                else:
                    gpu += node.duration_micros
                num_ops += _attr(node, "num_ops") or 0
            elif node.type in (pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
                comm += node.duration_micros
                kind = _attr(node, "comm_type")
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
            summary.linked = self.linked_units
            summary.linked_by_rf_id = sum(1 for u in self.selection.units
                                          if u.op.id in self.cpu.event_of and self.cpu.event_of[u.op.id].rf_id == u.op.rf_id
                                          and u.op.rf_id is not None)
            summary.gpu_events = len(self.gpu.launches)
            summary.gpu_linked = self.gpu_linked
        return summary


def _micros(value: float) -> int:
    return max(0, int(round(value)))


def _attr(node: pb.Node, name: str):
    """The value of the node's first attribute called `name` (None if absent)."""
    for attr in node.attr:
        if attr.name == name:
            return attr_value(attr)
    return None


def _host_attrs(op: HostOp) -> list[pb.AttributeProto]:
    attrs = []
    if op.op_schema:
        attrs.append(str_attr("op_schema", op.op_schema))
    if op.rf_id is not None and op.rf_id >= 0:
        attrs.append(uint_attr("rf_id", op.rf_id))
    if op.tid is not None and op.tid >= 0:
        attrs.append(uint_attr("tid", op.tid))
    attrs.append(int_attr("host_op_id", op.id))
    return attrs


def _gpu_family(event: Event) -> str:
    if "memcpy" in event.category:
        return "memcpy"
    if "memset" in event.category:
        return "memset"
    return "kernel"


def _first_per_stream(nodes: list[pb.Node], indices: list[int]) -> list[int]:
    seen, first = set(), []
    for index in indices:
        stream = _attr(nodes[index], "stream")
        if stream not in seen:
            seen.add(stream)
            first.append(index)
    return first
