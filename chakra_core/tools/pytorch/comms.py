"""Communication operators of a host trace: which ones, what they move, among whom.

A collective shows up as nested scopes: the API call (`c10d::allreduce_`, a functional
collective), a `record_param_comms` scope holding its parameters, and the backend's scope
(`nccl:all_reduce`, `gloo:all_reduce`). Any of them may be missing, and backends that run
collectives on their own thread (gloo) record the backend scope elsewhere in the tree. The
outermost recognised scope is the communication operator; the others only contribute facts.

Facts, first source that has them wins:

- type: the operator's name (for `record_param_comms`, the collective name it records);
- send / receive buffers: `in_msg_nelems` / `out_msg_nelems` x `dtype` attributes (schema
  1.1), else `record_param_comms`' input / output tensors, else the API call's operands
  (output first for gather-like calls), else the backend scope's tensors;
- process group: the `pg_name` attribute, else the `(pg_name, pg_desc)` operand, else the
  backend id of a `## process_group:init ##` entry (schema 1.0.2);
- rank: the integer operand before the collective name in `record_param_comms` (the root for
  rooted collectives and the peer for send / receive); roots, peers and tags of the API call's
  own operands take precedence.

- group size (to derive one buffer from the other when only one is known): the `pg_size`
  attribute, else `record_param_comms`' rank list or split-size lists or trailing world size,
  else the functional call's `group_size` operand, else the process-group definitions.

`comm_size` follows the one rule of docs/collectives.md (ASTRA-sim's meaning, what the system
layer times): each rank's input for every type (the whole buffer of an all-reduce, broadcast or
reduce, each rank's input of an all-gather or gather, the full input of a reduce-scatter, the
whole send buffer of an all-to-all), except scatter, where it is the piece each rank receives;
0 for a barrier. PyTorch records what that needs: `in_msg_nelems` is the input of every type
and `out_msg_nelems` the output (N x the input for all-gather, 1/N of it for reduce-scatter).
An all-to-all with split sizes (`all_to_all_single(..., output_split_sizes, input_split_sizes)`,
recorded as `in_split_size` / `out_split_size`) keeps its pieces: `comm_send_splits` and
`comm_recv_splits`, bytes to and from each member (docs/collectives.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from chakra_core.schema import pb
from chakra_core.tools.pytorch.host import HostOp
from chakra_core.tools.pytorch.ops import arg_tensors, dtype_bytes, sum_bytes, tensors

SEND, RECV = "send", "recv"
_KEYWORDS = (("reducescatter", pb.REDUCE_SCATTER), ("allreduce", pb.ALL_REDUCE),
             ("allgather", pb.ALL_GATHER), ("alltoall", pb.ALL_TO_ALL), ("broadcast", pb.BROADCAST),
             ("barrier", pb.BARRIER), ("reduce", pb.REDUCE), ("gather", pb.GATHER),
             ("scatter", pb.SCATTER), ("send", SEND), ("recv", RECV))
_API_PREFIXES = ("c10d::", "_c10d_functional::", "c10d_functional::")
BACKEND_PREFIXES = ("nccl:", "gloo:", "mpi:", "ucc:", "xccl:", "hccl:", "rccl:")
RPC = "record_param_comms"
ROOTED = frozenset({pb.BROADCAST, pb.REDUCE, pb.GATHER, pb.SCATTER})
# c10d API calls whose first operand is the output (the receive buffer); functional collectives
# (`_c10d_functional::all_gather_into_tensor(input, group_size, group_name)`) take the input first.
_OUTPUT_FIRST = ("allgather", "reducescatter", "alltoall", "gather", "scatter")
_FUNCTIONAL_PREFIXES = ("_c10d_functional::", "c10d_functional::")


def kind_of(name: str) -> int | str | None:
    """CollectiveCommType value, SEND, RECV, or None for a name (any spelling: all_reduce,
    allreduce_, _allgather_base_, all_to_allv, nccl:all_to_all, ncclKernel_AllReduce...)."""
    base = name.rsplit(":", 1)[-1].replace("_", "").replace("-", "").lower()
    if not base or "wait" in base:
        return None
    for keyword, kind in _KEYWORDS:
        if keyword in base:
            return kind
    return None


def is_backend_op(name: str) -> bool:
    return name.startswith(BACKEND_PREFIXES) and kind_of(name) is not None


def rpc_collective(op: HostOp) -> str | None:
    """The collective name a `record_param_comms` scope records."""
    name = op.attrs.get("collective_name")
    if isinstance(name, str):
        return name
    for value, kind in zip(op.inputs.values, op.inputs.types):
        if kind == "String" and isinstance(value, str):
            return value
    return None


def comm_kind(op: HostOp) -> int | str | None:
    """The kind of communication an operator performs, or None if it is not a communication op."""
    name = op.name
    if name.startswith(_API_PREFIXES) or name.startswith(BACKEND_PREFIXES):
        return kind_of(name)
    if name == RPC:
        collective = rpc_collective(op)
        return kind_of(collective) if collective else None
    return None


def node_type_of(kind: int | str) -> pb.NodeType:
    if kind == SEND:
        return pb.COMM_SEND_NODE
    if kind == RECV:
        return pb.COMM_RECV_NODE
    return pb.COMM_COLL_NODE


def type_name(kind: int | str) -> str:
    return kind.upper() if isinstance(kind, str) else pb.CollectiveCommType.Name(kind)


@dataclass
class CommInfo:
    """What a communication operator does (see the module docstring for where each fact comes from)."""

    kind: int | str
    in_bytes: int = 0
    out_bytes: int = 0
    pg_name: str | None = None
    root: int | None = None     # group rank of the root of a rooted collective
    peer: int | None = None     # group rank of the other side of a send / receive
    tag: int | None = None
    rank: int | None = None     # this rank, when the trace records it
    group_ranks: list[int] | None = None   # from record_param_comms' rank start / stride / size
    group_size: int | None = None          # members of the collective's group, when recorded
    splits: tuple[tuple[int, ...], tuple[int, ...]] | None = None   # an uneven all-to-all's bytes per member


def comm_size(info: CommInfo, group_size: int | None) -> tuple[int, str | None]:
    """(comm_size, problem): the size the rule of docs/collectives.md gives `info`, and why it is
    approximate when the buffer the rule names is missing and the group size is unknown."""
    kind, ins, outs = info.kind, info.in_bytes, info.out_bytes
    if kind == pb.BARRIER:
        return 0, None
    if kind not in (pb.SCATTER, pb.REDUCE_SCATTER, pb.ALL_GATHER, pb.GATHER):
        return ins or outs, None   # input and output are the same size (the backend's is the input)
    derive: Callable[[int], int]      # group size -> the wanted size
    if kind == pb.SCATTER:   # the piece each rank receives; the root's input is N pieces
        wanted, other, known, derive = outs, ins, "input", lambda n: ins // n
    elif kind == pb.REDUCE_SCATTER:   # the full input; each rank's output is 1/N of it
        wanted, other, known, derive = ins, outs, "output", lambda n: outs * n
    else:   # all-gather, gather: each rank's input; the output is N x it
        wanted, other, known, derive = ins, outs, "output", lambda n: outs // n
    if wanted or not other:
        return wanted, None
    if group_size:
        return derive(group_size), None
    return other, (f"the trace gives only the {known} buffer ({other} B), not the group size; "
                   f"comm_size {other} B may be off by a factor of the group size")


def describe(op: HostOp, parts: Iterable[HostOp], backend_ids: dict[int, str]) -> CommInfo:
    """Facts about communication operator `op` from itself and its absorbed scopes `parts`."""
    scopes = [op, *parts]
    rpcs = [p for p in scopes if p.name == RPC and comm_kind(p) is not None]
    backends = [p for p in scopes if p.name.startswith(BACKEND_PREFIXES)]
    kind = comm_kind(op)
    if kind is None:
        raise ValueError(f"{op.label()} is not a communication operator")
    info = CommInfo(kind)
    rpc = rpcs[0] if rpcs else None
    _sizes(info, op, rpc, backends)
    if rpc is not None:
        _rpc_facts(info, rpc, backend_ids)
    if info.pg_name is None and isinstance(op.attrs.get("pg_name"), str):
        info.pg_name = op.attrs["pg_name"]
    _api_facts(info, op)
    return info


def _sizes(info: CommInfo, op: HostOp, rpc: HostOp | None, backends: list[HostOp]) -> None:
    """The input and output buffers, each as recorded (comm_size() picks by type)."""
    if rpc is not None:
        elem = dtype_bytes(str(rpc.attrs.get("dtype", ""))) if rpc.attrs.get("dtype") else None
        if elem is None:
            found = tensors(rpc.inputs) + tensors(rpc.outputs)
            elem = found[0].elem_bytes if found else None
        if info.kind == pb.ALL_TO_ALL and elem is not None:
            info.splits = _splits(rpc, elem)
        nin, nout = rpc.attrs.get("in_msg_nelems"), rpc.attrs.get("out_msg_nelems")
        if elem is not None and isinstance(nin, int) and isinstance(nout, int):
            info.in_bytes, info.out_bytes = nin * elem, nout * elem
            return
        ins, outs = sum_bytes(arg_tensors(rpc.inputs, 0)), sum_bytes(tensors(rpc.outputs))
        if ins or outs:
            info.in_bytes, info.out_bytes = ins, outs
            return
    if op.name.startswith(_FUNCTIONAL_PREFIXES):
        info.in_bytes = sum_bytes(arg_tensors(op.inputs, 0))
        info.out_bytes = sum_bytes(tensors(op.outputs))
        if info.in_bytes or info.out_bytes:
            return
    elif op.name.startswith(_API_PREFIXES):
        base = op.name.rsplit(":", 1)[-1].replace("_", "").lower()
        first, second = sum_bytes(arg_tensors(op.inputs, 0)), sum_bytes(arg_tensors(op.inputs, 1))
        if base.startswith(_OUTPUT_FIRST):
            info.in_bytes, info.out_bytes = second, first
        else:   # in place: all-reduce, broadcast, reduce, send, recv
            info.in_bytes = info.out_bytes = first
        if info.in_bytes or info.out_bytes:
            return
    for backend in backends:   # backend scopes record their input only
        info.in_bytes = info.out_bytes = sum_bytes(tensors(backend.inputs))
        if info.in_bytes:
            return


def _splits(rpc: HostOp, elem: int) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """An all-to-all's pieces in bytes, to and from each member: record_param_comms'
    `in_split_size` / `out_split_size` attributes (elements per member, schema 1.1), else the two
    lists after the collective's name (1.0.2+); None when either is empty (an even split)."""
    found = [_element_list(rpc.attrs.get(key)) for key in ("in_split_size", "out_split_size")]
    if None in found:
        types = rpc.inputs.types
        name_at = next((i for i, kind in enumerate(types) if kind == "String"), None)
        after = rpc.inputs.values[name_at + 1:name_at + 3] if name_at is not None else []
        found = [_element_list(value) for value in after] if len(after) == 2 else [None, None]
    send, recv = found
    if not send or not recv:
        return None
    return tuple(n * elem for n in send), tuple(n * elem for n in recv)


def _element_list(value: Any) -> list[int] | None:
    """A list of element counts, as recorded (a list, or its JSON text); None if it is not one."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        return value
    return None


def _rpc_facts(info: CommInfo, rpc: HostOp, backend_ids: dict[int, str]) -> None:
    attrs, values, types = rpc.attrs, rpc.inputs.values, rpc.inputs.types
    if isinstance(attrs.get("pg_name"), str):
        info.pg_name = attrs["pg_name"]
    name_at = next((i for i, (v, t) in enumerate(zip(values, types)) if t == "String"), None)
    for value, kind in zip(values, types):
        if info.pg_name is None and str(kind).startswith("Tuple[String") and isinstance(value, list) and value:
            info.pg_name = str(value[0])
        if info.pg_name is None and kind == "Int" and value in backend_ids:
            info.pg_name = backend_ids[value]
    if name_at is not None and name_at > 0 and types[name_at - 1] == "Int" and isinstance(values[name_at - 1], int):
        before = values[name_at - 1]
        if info.kind in ROOTED:
            info.root = before
        elif info.kind in (SEND, RECV):
            info.peer = before
        else:
            info.rank = before
    start, stride, size = attrs.get("global_rank_start"), attrs.get("global_rank_stride"), attrs.get("pg_size")
    if isinstance(start, int) and isinstance(stride, int) and isinstance(size, int) and size > 0 and stride > 0:
        info.group_ranks = [start + i * stride for i in range(size)]
    info.group_size = _rpc_group_size(attrs, values, types, name_at)


def _rpc_group_size(attrs: dict[str, Any], values: list[Any], types: list[Any], name_at: int | None) -> int | None:
    """`pg_size`, else the trailing world-size operand (schemas 1.0.2+: name, in splits, out splits,
    [rank start, stride,] world size), else the length of a non-empty split-size list (1.0.1)."""
    size = attrs.get("pg_size")
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    if name_at is None:
        return None
    after = list(zip(values[name_at + 1:], types[name_at + 1:]))
    if len(after) >= 3 and after[-1][1] == "Int" and isinstance(after[-1][0], int) and after[-1][0] > 0:
        return after[-1][0]
    for value, _ in after[:2]:
        if isinstance(value, list) and value:
            return len(value)
    return None


def _api_facts(info: CommInfo, op: HostOp) -> None:
    """Root, peer and tag from the API call's own integer operands (c10d signatures); the group
    size of a functional all-gather / reduce-scatter (`(input, [reduce_op,] group_size, group_name)`)."""
    if op.name.startswith(_FUNCTIONAL_PREFIXES) and info.group_size is None \
            and info.kind in (pb.ALL_GATHER, pb.REDUCE_SCATTER):
        ints = [v for v, t in zip(op.inputs.values, op.inputs.types) if t == "Int" and isinstance(v, int)]
        if ints and ints[0] > 0:
            info.group_size = ints[0]
    if not op.name.startswith("c10d::"):
        return
    ints = [v for v, t in zip(op.inputs.values, op.inputs.types)
            if t == "Int" and isinstance(v, int) and not isinstance(v, bool)]
    if info.kind in ROOTED and ints:
        info.root = ints[0]
    elif info.kind in (SEND, RECV) and ints:
        info.peer = ints[0]
        if len(ints) > 1:
            info.tag = ints[1]


# Process groups -------------------------------------------------------------------------------
@dataclass
class Group:
    name: str
    ranks: list[int]           # empty: every rank of the job
    size: int | None = None
    desc: str = ""
    backend_id: int | None = None


class ProcessGroups:
    """Process-group definitions gathered from the host trace, the Kineto trace and the
    communication operators' own parameters."""

    def __init__(self) -> None:
        self.groups: dict[str, Group] = {}
        self.world_size: int | None = None

    def add_entries(self, entries: Any, source: str, warnings: list[str]) -> None:
        """`pg_config`-style entries: a JSON text or list of {pg_name, ranks, group_size|pg_size...}."""
        if isinstance(entries, str):
            try:
                entries = json.loads(entries)
            except ValueError:
                warnings.append(f"{source}: process groups are not valid JSON ({entries[:80]!r}); ignored")
                return
        if isinstance(entries, dict):
            entries = list(entries.values()) if all(isinstance(v, dict) for v in entries.values()) else [entries]
        if not isinstance(entries, list):
            warnings.append(f"{source}: process groups are not a list; ignored")
            return
        for entry in entries:
            if not isinstance(entry, dict) or "pg_name" not in entry:
                warnings.append(f"{source}: process-group entry without pg_name ignored: {str(entry)[:80]}")
                continue
            ranks = entry.get("ranks") or []
            if not isinstance(ranks, list) or not all(isinstance(r, int) for r in ranks):
                warnings.append(f"{source}: process group {entry['pg_name']!r} has ranks {ranks!r}; "
                                "treated as every rank")
                ranks = []
            size = entry.get("group_size", entry.get("pg_size"))
            backend = entry.get("backend_id")
            self.add(Group(str(entry["pg_name"]), list(ranks), size if isinstance(size, int) else None,
                           str(entry.get("pg_desc", "")), backend if isinstance(backend, int) else None))

    def add(self, group: Group) -> None:
        known = self.groups.get(group.name)
        if known is None:
            self.groups[group.name] = group
            return
        if not known.ranks and group.ranks:
            known.ranks = group.ranks
        known.size = known.size or group.size
        known.desc = known.desc or group.desc
        known.backend_id = known.backend_id if known.backend_id is not None else group.backend_id

    def backend_ids(self) -> dict[int, str]:
        return {g.backend_id: g.name for g in self.groups.values() if g.backend_id is not None}

    def job_size(self) -> int | None:
        """Ranks in the job: the Kineto world size, else the default group's size."""
        if self.world_size:
            return self.world_size
        for group in self.groups.values():
            if group.name == "0" or group.desc == "default_pg":
                return group.size or (len(group.ranks) or None)
        return None

    def spans_job(self, group: Group) -> bool:
        size = self.job_size()
        return not group.ranks or (size is not None and sorted(group.ranks) == list(range(size)))

    def global_rank(self, pg_name: str | None, group_rank: int) -> int:
        """The job rank of a group rank (a group listing its ranks maps them; others are the job)."""
        group = self.groups.get(pg_name) if pg_name is not None else None
        if group is None or self.spans_job(group) or not 0 <= group_rank < len(group.ranks):
            return group_rank
        return sorted(group.ranks)[group_rank]

    def entries(self, used: set[str]) -> list[tuple[str, list[int]]]:
        """(name, ranks) of the groups in `used`, for the METADATA node. Groups spanning the whole
        job get [] ("every rank of the simulated run"), so a simulation of fewer ranks runs them
        among the ranks present; groups no collective of this rank uses are left out, as their
        other members may not be simulated."""
        return [(name, [] if self.spans_job(g) else sorted(g.ranks))
                for name, g in sorted(self.groups.items()) if name in used]
