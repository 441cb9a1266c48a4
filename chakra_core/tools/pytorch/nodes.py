"""The nodes of one rank: each unit's host-side node, the GPU work it launched, its communication.

Node ids are dense and follow program order: an optional METADATA node (process groups)
first, then each unit (see units.py) in host id order, each followed by the GPU work it
launched in start order. The simulator issues ready nodes smallest id first, so this order
is also its tie-break.

Without Kineto, each unit is one node: a COMP node (`is_cpu_op` false when it works on device
tensors and is not a view/allocation, so a compute model can time it from `num_ops`), or a
COMM node. With Kineto, each unit is a CPU COMP node with its measured duration; its kernels
and copies are GPU COMP nodes on their streams, and an NCCL kernel becomes the communication
node (communication without a kernel, as with gloo, is a node of its own).

`NodeBuilder` also adds the dependencies that come with emitting a unit (program order on its
thread, a GPU node on the CPU node that launched it, collectives of a group in trace order) and
records threads, streams and launches for the others (`convert`).
"""

from __future__ import annotations

from typing import Any, TypedDict

from chakra_core.et.attrs import attr_value
from chakra_core.et.dtypes import operands_dtype
from chakra_core.schema import pb
from chakra_core.comm.collectives import RECV_SPLITS, SEND_SPLITS
from chakra_core.et.build import bool_attr, int_attr, process_group_json, str_attr, uint_attr, uint_list_attr
from chakra_core.tools.pytorch import comms
from chakra_core.tools.pytorch.comms import CommInfo, ProcessGroups
from chakra_core.tools.pytorch.deps import Dependencies
from chakra_core.tools.pytorch.flops import Estimate, estimate
from chakra_core.tools.pytorch.host import HostOp, HostTrace
from chakra_core.tools.pytorch.job import JobContext
from chakra_core.tools.pytorch.kineto import Event, KinetoTrace
from chakra_core.tools.pytorch.link import CpuLinks, GpuLinks, Launch
from chakra_core.tools.pytorch.ops import is_operator, is_trivial, operand_bytes, tensors
from chakra_core.tools.pytorch.units import Unit


class NodeBuilder(JobContext):
    """Emits one rank's nodes unit by unit (see the module docstring)."""

    def __init__(self, host: HostTrace, kineto: KinetoTrace | None, rank: int | None):
        super().__init__(host, kineto, rank)
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
        self.cpu: CpuLinks | None = None
        self.gpu: GpuLinks | None = None

    # Nodes ---------------------------------------------------------------------------------------
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

    def _new_node(self, name: str, node_type: pb.NodeType, attrs: list[pb.AttributeProto],
                  duration: float = 0.0, start: float = 0.0) -> int:
        index = self.deps.add_node()
        self.nodes.append(pb.Node(id=index, name=name, type=node_type, attr=attrs,
                                  duration_micros=to_micros(duration), start_time_micros=to_micros(start)))
        return index

    def _launches_by_unit(self) -> dict[int, list[Launch]]:
        """Unit op id -> the GPU work it launched (start order)."""
        by_unit: dict[int, list[Launch]] = {}
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
        assert self.cpu is not None     # called once the Kineto trace is linked (self.gpu is set)
        started = [u for u in below if (e := self.cpu.event_of.get(u.op.id)) is not None and e.ts <= ts]
        return started[-1] if started else (below[0] if below else None)

    def _emit_unit(self, unit: Unit, launches: list[Launch], cursor: dict[int, int | None],
                   last_collective: dict[str, int]) -> None:
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
            assert self.cpu is not None     # comm_node is None here only with a Kineto trace, linked in run()
            shadow = self.cpu.event_of.get(unit.shadow) if unit.shadow is not None else None
            comm_node = self._comm_node(op, info, None, shadow or event)
            self.deps.control(comm_node, node)
            self.unit_of_node[comm_node] = op.id
            self.async_nodes.add(comm_node)
        if comm_node is not None:
            assert info is not None         # only communication units have a communication node
            self.comm_node_of[op.id] = comm_node
            group = info.pg_name or ""
            self.deps.control(comm_node, last_collective.get(group))
            last_collective[group] = comm_node
        work: _Work = {"num_ops": flops.num_ops, "tensor_size": operand_bytes(op.inputs) + operand_bytes(op.outputs)}
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

    def _host_side(self, node: int, unit: Unit, cursor: dict[int, int | None], advance: bool) -> None:
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

    def _gpu_side(self, node: int, unit: Unit, launch: Launch, gpu_nodes: list[int]) -> None:
        kernel = launch.event
        self.deps.control(node, self.cpu_node[unit.op.id])
        stream = kernel.stream if kernel.stream is not None else -1
        self.stream_nodes.setdefault(stream, []).append((launch.launch_ts, kernel.ts, node))
        gpu_nodes.append(node)
        self.unit_of_node[node] = unit.op.id
        self.async_nodes.add(node)

    def _extend(self, node: int, kernel: Event) -> None:
        target = self.nodes[node]
        end = max(target.start_time_micros + target.duration_micros, to_micros(kernel.end))
        target.duration_micros = end - target.start_time_micros

    def _split_attrs(self, op: HostOp, info: CommInfo, size: int) -> list[pb.AttributeProto]:
        """An all-to-all's recorded pieces (comm_send_splits, comm_recv_splits), when they describe
        its send buffer (kept even when equal: every member of the collective must carry them
        alike); else none, and the system layer splits it evenly."""
        if info.splits is None:
            return []
        send, recv = info.splits
        group = info.group_size or self._group_size(info.pg_name)
        if sum(send) != size or len(send) != len(recv) or (group is not None and len(send) != group):
            self.warnings.append(f"{self.host.path}: {op.label()}: its split sizes ({len(send)} pieces "
                                 f"summing to {sum(send):,} B) do not describe its send buffer of {size:,} B "
                                 f"among {group or '?'} ranks; left out (an even split)")
            return []
        return [uint_list_attr(SEND_SPLITS, send), uint_list_attr(RECV_SPLITS, recv)]

    def _comm_node(self, op: HostOp, info: CommInfo, kernel: Event | None, event: Event | None) -> int:
        node_type = comms.node_type_of(info.kind)
        attrs = [bool_attr("is_cpu_op", False), str_attr("op_type", "communication")]
        if node_type == pb.COMM_COLL_NODE:
            assert isinstance(info.kind, int)   # a collective's kind is its CollectiveCommType
            attrs.append(int_attr("comm_type", info.kind))
        size, problem = comms.comm_size(info, info.group_size or self._group_size(info.pg_name))
        if problem:
            self.warnings.append(f"{self.host.path}: {op.label()}: {problem}")
        attrs.append(uint_attr("comm_size", max(0, size)))
        attrs += self._split_attrs(op, info, size)
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

    def _place_work(self, cpu_node: int, gpu_nodes: list[int], work: _Work) -> None:
        """num_ops / tensor_size go to the longest compute kernel when there is one (what a
        compute model times), else to the host-side node (communication: always there)."""
        kernels = [n for n in gpu_nodes if self.nodes[n].type == pb.COMP_NODE
                   and node_attr(self.nodes[n], "op_type") == "kernel"]
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
        if work["tensor_size"] > 0 and node_attr(target, "tensor_size") is None:
            target.attr.append(uint_attr("tensor_size", work["tensor_size"]))



class _Work(TypedDict):
    """What `_place_work` attaches to a unit's nodes."""

    num_ops: int | None
    tensor_size: int


def to_micros(value: float) -> int:
    """Whole microseconds (at least 0) of a Kineto time or duration."""
    return max(0, int(round(value)))


def node_attr(node: pb.Node, name: str) -> Any:
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
