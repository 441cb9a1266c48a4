"""ASTRA-sim 1.0 text workloads to Chakra traces (`chakra-sim convert text`).

An ASTRA-sim 1.0 workload file describes one training iteration layer by layer:

    <PARALLELISM> [header parameters]
    <number of layers>
    <name> <reserved> <fwd compute> <fwd comm type> <fwd comm size>
           <input-grad compute> <ig comm type> <ig comm size>
           <weight-grad compute> <wg comm type> <wg comm size> <update time> [<layer policy>]

Compute and update times are cycles (ns: ASTRA-sim 1.0 ran at 1 GHz), comm
sizes bytes, comm types ALLREDUCE, ALLGATHER, REDUCESCATTER, ALLTOALL or
NONE. Header parameters: `HYBRID_DLRM <last bottom layer>`,
`HYBRID_TRANSFORMER model_parallel_NPU_group: <M>`, and
`HYBRID_TRANSFORMER_FWD_IN_BCKWD model_parallel_NPU_group: <M> checkpoints:
<n> <layer>... checkpoint_initiates: <n> <layer>...`; `HYBRID_CUSTOMIZED`
lines end with the layer's own policy (DATA, MODEL, HYBRID_DATA_MODEL,
HYBRID_MODEL_DATA).

The converter reproduces ASTRA-sim 1.0's workload loop (`Workload.cc`,
`Layer.cc` at astra-sim c94c7460) as a dependency graph, one graph per NPU:

- the loop is sequential: every compute step waits for the previous one;
- a *blocking* collective (forward-pass collectives of the model/hybrid
  policies) is waited for before the next step; a *non-blocking* one
  (weight-gradient collectives everywhere, input-gradient ones of the hybrid
  policies) runs in the background until a later step waits for it: the
  forward pass of layer i waits for layer i's weight-gradient collective of
  the previous pass, the input-gradient step of layer i-1 for layer i's
  input-gradient collective;
- the per-layer update time delays, as in `Layer::call`, the moment a
  collective of that layer counts as finished: it becomes a CPU node of that
  duration after the collective (so it never occupies the GPU stream);
- which collectives a policy issues, and on which NPUs, follows ASTRA-sim's
  `decode_involved_dimensions`: DATA weight gradients among all NPUs; MODEL
  forward and input gradients among all NPUs; the hybrids split the NPUs into
  consecutive blocks (ASTRA-sim's first network dimension, or the
  model-parallel group of the transformer policies) and strided groups (the
  remaining dimensions). A collective whose group is a single NPU does nothing
  in ASTRA-sim and is left out.

Time: Chakra's `duration_micros` is an integer number of µs, so compute and
update times are rounded to the nearest µs there (ASTRA-sim's replay, and
chakra-sim's, run a 0 µs node for 1 ns); the exact ns value is kept in the
uint64 attribute `duration_ns`. The command reports how much the rounding
changes the total.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import click

from chakra_core.errors import ChakraSimError
from chakra_core.schema import pb
from chakra_core.cli.output import tool_errors
from chakra_core.tools._build import (Stream, bool_attr, read_collective, metadata, micros_from_ns,
                                      uint_attr, write_rank_files)


class TextWorkloadError(ChakraSimError):
    """An ASTRA-sim 1.0 text workload cannot be read or converted; the message names file and line."""


COMM_TYPES = {
    "ALLREDUCE": pb.ALL_REDUCE,
    "ALLGATHER": pb.ALL_GATHER,
    "REDUCESCATTER": pb.REDUCE_SCATTER,
    "ALLTOALL": pb.ALL_TO_ALL,
    "NONE": None,
}

POLICIES = ("DATA", "MODEL", "HYBRID_DATA_MODEL", "HYBRID_MODEL_DATA", "HYBRID_DLRM",
            "HYBRID_DLRM_ENHANCED", "MICRO", "HYBRID_TRANSFORMER", "HYBRID_TRANSFORMER_FWD_IN_BCKWD",
            "HYBRID_CUSTOMIZED", "DISTRIBUTED_INFERENCE")
LAYER_POLICIES = ("DATA", "MODEL", "HYBRID_DATA_MODEL", "HYBRID_MODEL_DATA")
TRANSFORMERS = ("HYBRID_TRANSFORMER", "HYBRID_TRANSFORMER_FWD_IN_BCKWD")
DLRMS = ("HYBRID_DLRM", "HYBRID_DLRM_ENHANCED")

COLUMNS = ("name", "reserved", "forward compute", "forward comm type", "forward comm size",
           "input-grad compute", "input-grad comm type", "input-grad comm size",
           "weight-grad compute", "weight-grad comm type", "weight-grad comm size", "update time")

PHASES = ("fwd", "ig", "wg")
PHASE_NAMES = {"fwd": "forward", "ig": "input-gradient", "wg": "weight-gradient"}

# Where each policy runs each phase's collective (ASTRA-sim's decode_involved_dimensions):
# "world" = all NPUs, "model"/"data" = the model-/data-parallel group, None = nowhere.
_PHASE_GROUPS = {
    "DATA": {"fwd": None, "ig": None, "wg": "world"},
    "MICRO": {"fwd": None, "ig": None, "wg": "world"},
    "HYBRID_DLRM": {"fwd": None, "ig": None, "wg": "world"},
    "HYBRID_DLRM_ENHANCED": {"fwd": None, "ig": None, "wg": "world"},
    "MODEL": {"fwd": "world", "ig": "world", "wg": None},
    "DISTRIBUTED_INFERENCE": {"fwd": "world", "ig": "world", "wg": None},
    "HYBRID_DATA_MODEL": {"fwd": "model", "ig": "model", "wg": "data"},
    "HYBRID_MODEL_DATA": {"fwd": "model", "ig": "model", "wg": "data"},
    "HYBRID_TRANSFORMER": {"fwd": "model", "ig": "model", "wg": "data"},
    "HYBRID_TRANSFORMER_FWD_IN_BCKWD": {"fwd": "model", "ig": "model", "wg": "data"},
}
_ALL_WORLD = {"fwd": "world", "ig": "world", "wg": "world"}
# Which group is the consecutive block ("block") and which the strided one ("stride").
_LAYOUT = {
    "HYBRID_DATA_MODEL": {"model": "block", "data": "stride"},
    "HYBRID_MODEL_DATA": {"model": "stride", "data": "block"},
    "HYBRID_TRANSFORMER": {"model": "block", "data": "stride"},
    "HYBRID_TRANSFORMER_FWD_IN_BCKWD": {"model": "block", "data": "stride"},
}


# Parsing ---------------------------------------------------------------------------------------
@dataclass
class LayerSpec:
    """One layer line. Times in cycles (ns), sizes in bytes; comm types are COMM_TYPES keys."""

    name: str
    line: int
    reserved: int
    compute: dict[str, int]        # phase -> cycles
    comm_type: dict[str, str]      # phase -> ALLREDUCE ... NONE
    comm_size: dict[str, int]      # phase -> bytes
    update: int
    policy: str | None = None      # HYBRID_CUSTOMIZED: the layer's own policy


@dataclass
class TextWorkload:
    path: str
    parallelism: str
    layers: list[LayerSpec]
    model_parallel_group: int | None = None     # transformer header
    last_bottom_layer: int | None = None        # DLRM header
    checkpoints: list[int] = field(default_factory=list)
    initiators: list[int] = field(default_factory=list)
    ignored_lines: list[int] = field(default_factory=list)


def _int(token: str, where: str, what: str, minimum: int | None = 0) -> int:
    try:
        value = int(token)
    except ValueError:
        raise TextWorkloadError(f"{where}: {what} must be an integer, found {token!r}") from None
    if minimum is not None and value < minimum:
        raise TextWorkloadError(f"{where}: {what} must be >= {minimum}, found {value}")
    return value


def _int_list(tokens: list[str], pos: int, where: str, label: str) -> tuple[list[int], int]:
    """`<count> <value>...` starting at tokens[pos]; return (values, next position)."""
    if pos >= len(tokens):
        raise TextWorkloadError(f"{where}: '{label}' needs a count and that many layer indices")
    count = _int(tokens[pos], where, f"the count after '{label}'")
    values = tokens[pos + 1:pos + 1 + count]
    if len(values) < count:
        raise TextWorkloadError(f"{where}: '{label}' announces {count} layer(s) but lists {len(values)}")
    return [_int(v, where, f"a layer index after '{label}'") for v in values], pos + 1 + count


def parse_text_workload(path: str | os.PathLike) -> TextWorkload:
    """Read an ASTRA-sim 1.0 text workload; raise TextWorkloadError naming the line on any problem."""
    spath = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise TextWorkloadError(f"{spath}: cannot read: {exc.strerror or exc}") from exc
    lines = [(number, line.split()) for number, line in enumerate(text.splitlines(), start=1)]
    lines = [(number, tokens) for number, tokens in lines if tokens]
    if not lines:
        raise TextWorkloadError(f"{spath}: empty file: expected a parallelism type on the first line")
    number, header = lines[0]
    where = f"{spath}:{number}"
    kind = header[0]
    if kind not in POLICIES:
        raise TextWorkloadError(f"{where}: unknown parallelism type {kind!r}; expected one of "
                                f"{', '.join(POLICIES)}")
    workload = TextWorkload(spath, kind, [])
    rest = header[1:]
    if kind in DLRMS:
        if len(rest) != 1:
            raise TextWorkloadError(f"{where}: {kind} takes one header value, the index of the last "
                                    f"bottom-MLP layer (e.g. '{kind} 4')")
        workload.last_bottom_layer = _int(rest[0], where, "the last bottom layer")
    elif kind in TRANSFORMERS:
        if len(rest) < 2:
            raise TextWorkloadError(f"{where}: {kind} needs 'model_parallel_NPU_group: <NPUs>' in the header")
        workload.model_parallel_group = _int(rest[1], where, f"{rest[0]!r} (model-parallel group)",
                                             minimum=1)
        pos = 2
        if kind == "HYBRID_TRANSFORMER_FWD_IN_BCKWD":
            if len(rest) < 3:
                raise TextWorkloadError(f"{where}: {kind} needs 'checkpoints: <n> <layer>...' and "
                                        "'checkpoint_initiates: <n> <layer>...' after the group size")
            workload.checkpoints, pos = _int_list(rest, pos + 1, where, rest[pos])
            if pos >= len(rest):
                raise TextWorkloadError(f"{where}: {kind} needs 'checkpoint_initiates: <n> <layer>...'")
            workload.initiators, pos = _int_list(rest, pos + 1, where, rest[pos])
        if pos < len(rest):
            raise TextWorkloadError(f"{where}: unexpected {' '.join(rest[pos:])!r} in the header")
    elif rest:
        raise TextWorkloadError(f"{where}: unexpected {' '.join(rest)!r} after {kind} (it takes no "
                                "header values)")
    if len(lines) < 2:
        raise TextWorkloadError(f"{spath}: missing the number of layers on the second line")
    number, count_tokens = lines[1]
    where = f"{spath}:{number}"
    if len(count_tokens) != 1:
        raise TextWorkloadError(f"{where}: expected the number of layers alone on this line, found "
                                f"{' '.join(count_tokens)!r}")
    count = _int(count_tokens[0], where, "the number of layers", minimum=1)
    body = lines[2:]
    if len(body) < count:
        raise TextWorkloadError(f"{spath}: the file announces {count} layer(s) on line {number} but "
                                f"has {len(body)} layer line(s)")
    columns = len(COLUMNS) + (1 if kind == "HYBRID_CUSTOMIZED" else 0)
    for number, tokens in body[:count]:
        workload.layers.append(_parse_layer(spath, number, tokens, columns, kind))
    workload.ignored_lines = [number for number, _ in body[count:]]
    _check_header_layers(workload)
    return workload


def _parse_layer(spath: str, number: int, tokens: list[str], columns: int, kind: str) -> LayerSpec:
    where = f"{spath}:{number}"
    if len(tokens) != columns:
        expected = ", ".join(COLUMNS) + (", layer policy" if columns > len(COLUMNS) else "")
        raise TextWorkloadError(f"{where}: expected {columns} columns ({expected}), found {len(tokens)}")
    compute, comm_type, comm_size = {}, {}, {}
    for index, phase in enumerate(PHASES):
        base = 2 + 3 * index
        compute[phase] = _int(tokens[base], where, f"the {PHASE_NAMES[phase]} compute time")
        ctype = tokens[base + 1]
        if ctype not in COMM_TYPES:
            raise TextWorkloadError(f"{where}: unknown {PHASE_NAMES[phase]} communication type "
                                    f"{ctype!r}; expected one of {', '.join(COMM_TYPES)}")
        comm_type[phase] = ctype
        comm_size[phase] = _int(tokens[base + 2], where, f"the {PHASE_NAMES[phase]} comm size")
    layer = LayerSpec(name=tokens[0], line=number,
                      reserved=_int(tokens[1], where, "the reserved column", minimum=None),
                      compute=compute, comm_type=comm_type, comm_size=comm_size,
                      update=_int(tokens[11], where, "the update time"))
    if kind == "HYBRID_CUSTOMIZED":
        policy = tokens[12]
        if policy not in LAYER_POLICIES:
            raise TextWorkloadError(f"{where}: unknown layer policy {policy!r}; HYBRID_CUSTOMIZED "
                                    f"layers take one of {', '.join(LAYER_POLICIES)}")
        layer.policy = policy
    return layer


def _check_header_layers(workload: TextWorkload) -> None:
    n = len(workload.layers)
    where = f"{workload.path}:1"
    if workload.last_bottom_layer is not None and workload.last_bottom_layer >= n:
        raise TextWorkloadError(f"{where}: the last bottom layer {workload.last_bottom_layer} is not a "
                                f"layer index (the file has layers 0..{n - 1})")
    for label, values in (("checkpoint", workload.checkpoints), ("checkpoint initiator", workload.initiators)):
        for value in values:
            if value >= n:
                raise TextWorkloadError(f"{where}: {label} layer {value} is not a layer index "
                                        f"(the file has layers 0..{n - 1})")
    checkpoints = sorted(set(workload.checkpoints))
    initiators = set(workload.initiators)
    for start in sorted(initiators):
        below = [c for c in checkpoints if c < start]
        if not below:
            raise TextWorkloadError(f"{where}: layer {start} initiates a forward-in-backward "
                                    "recomputation but no checkpoint layer lies below it")
        between = [i for i in initiators if below[-1] < i < start]
        if between:
            raise TextWorkloadError(
                f"{where}: layers {between[0]} and {start} both initiate a recomputation from "
                f"checkpoint {below[-1]}; ASTRA-sim 1.0 would stop the recomputation at layer "
                f"{between[0]} and skip layers, so this file is rejected")


# Communicator groups -----------------------------------------------------------------------------
def default_first_dim(num_npus: int) -> int:
    """The largest divisor of `num_npus` not above its square root (8 -> 2, 16 -> 4, 64 -> 8)."""
    best = 1
    for k in range(1, math.isqrt(num_npus) + 1):
        if num_npus % k == 0:
            best = k
    return best


@dataclass
class GroupLayout:
    """Consecutive blocks of `block` NPUs ("block<i>") and the strided groups across them ("stride<j>")."""

    num_npus: int
    block: int

    def block_members(self, rank: int) -> tuple[str, list[int]]:
        index = rank // self.block
        return f"block{index}", list(range(index * self.block, (index + 1) * self.block))

    def stride_members(self, rank: int) -> tuple[str, list[int]]:
        index = rank % self.block
        return f"stride{index}", list(range(index, self.num_npus, self.block))


# Conversion ------------------------------------------------------------------------------------------
@dataclass
class ConversionReport:
    files: list[Path]
    parallelism: str
    nodes_per_rank: list[int]
    layout: GroupLayout | None
    compute_ns: int                  # one rank, exact
    compute_replay_ns: int           # one rank, after rounding to whole µs (0 µs replays as 1 ns)
    compute_nodes: int
    sub_500ns_nodes: int
    notes: list[str]


class _RankProgram:
    """ASTRA-sim 1.0's workload loop for one NPU, emitted as a Chakra graph."""

    def __init__(self, workload: TextWorkload, rank: int, layout: GroupLayout | None,
                 compute_scale: float, comm_scale: float, update_time: bool, notes: dict):
        self.wl = workload
        self.rank = rank
        self.layout = layout
        self.compute_scale, self.comm_scale = compute_scale, comm_scale
        self.update_time = update_time
        self.notes = notes
        self.s = Stream()
        self.pass_index = 0
        self.compute_ns = self.compute_replay_ns = self.compute_nodes = self.sub_500 = 0
        self.reached: set[tuple[int, str]] = set()
        self.phase_groups = [self._phase_groups(i, layer) for i, layer in enumerate(workload.layers)]
        self._group_names = self._resolve_groups()
        if self._group_names:
            self.s.define_groups(sorted(self._group_names.values(), key=lambda g: g[0]))

    # Groups ------------------------------------------------------------------------------------
    def _phase_groups(self, index: int, layer: LayerSpec) -> dict[str, str | None]:
        kind = self.wl.parallelism
        if kind in DLRMS and index == 0:
            return dict(_ALL_WORLD)
        policy = layer.policy or kind
        return dict(_PHASE_GROUPS[policy])

    def _layout_of(self, index: int) -> dict[str, str]:
        policy = self.wl.layers[index].policy or self.wl.parallelism
        return _LAYOUT.get(policy, {})

    def _resolve_groups(self) -> dict[str, tuple[str, list[int]]]:
        """Group kind ("block"/"stride") -> (name, members) for the groups this rank uses."""
        out = {}
        if self.layout is None:
            return out
        for index in range(len(self.wl.layers)):
            for role in self.phase_groups[index].values():
                if role in ("model", "data"):
                    which = self._layout_of(index)[role]
                    name, members = (self.layout.block_members(self.rank) if which == "block"
                                     else self.layout.stride_members(self.rank))
                    if len(members) > 1:
                        out[which] = (name, members)
        return out

    # Emission ---------------------------------------------------------------------------------------
    def _label(self, layer: LayerSpec, what: str) -> str:
        return f"p{self.pass_index}.{layer.name}.{what}"

    def compute(self, index: int, phase: str, recompute: bool = False) -> None:
        layer = self.wl.layers[index]
        ns = int(layer.compute[phase] * self.compute_scale)
        if ns <= 0:
            return   # ASTRA-sim waits 0 cycles: nothing to emit
        micros = micros_from_ns(ns)
        self.compute_ns += ns
        self.compute_replay_ns += micros * 1000 if micros else 1
        self.compute_nodes += 1
        self.sub_500 += ns < 500
        suffix = phase + (".recompute" if recompute else "")
        self.s.step(pb.COMP_NODE, self._label(layer, suffix), duration_micros=micros,
                    attrs=[bool_attr("is_cpu_op", False), uint_attr("duration_ns", ns)])

    def comm(self, index: int, phase: str, blocking: bool) -> int | None:
        """Issue layer `index`'s collective of `phase`; return the id that marks it finished."""
        layer = self.wl.layers[index]
        ctype = layer.comm_type[phase]
        if ctype == "NONE":
            return None
        self.reached.add((index, phase))
        role = self.phase_groups[index][phase]
        group_name = None
        if role is None:
            self._note(index, phase, f"not run: the {layer.policy or self.wl.parallelism} policy "
                                     f"involves no NPUs in {PHASE_NAMES[phase]} collectives")
            return None
        if role != "world":
            which = self._layout_of(index)[role]
            group = self._group_names.get(which)
            if group is None:
                self._note(index, phase, f"not run: its {role}-parallel group is a single NPU")
                return None
            group_name = group[0]
        size = int(layer.comm_size[phase] * self.comm_scale)
        node = self.s.launch(pb.COMM_COLL_NODE, self._label(layer, f"{phase}.{ctype}"),
                             attrs=read_collective(COMM_TYPES[ctype], size, group_name))
        done = node
        if self.update_time and layer.update > 0:
            ns = layer.update
            done = self.s.add(pb.COMP_NODE, self._label(layer, f"{phase}.{ctype}.update"), deps=[node],
                              duration_micros=micros_from_ns(ns),
                              attrs=[bool_attr("is_cpu_op", True), uint_attr("duration_ns", ns)])
        if blocking:
            self.s.wait(done)
        return done

    def _note(self, index: int, phase: str, text: str) -> None:
        layer = self.wl.layers[index]
        key = (index, phase)
        if key not in self.notes:
            self.notes[key] = (f"line {layer.line}: layer {layer.name!r} {PHASE_NAMES[phase]} "
                               f"{layer.comm_type[phase]} {text}")

    # ASTRA-sim 1.0's loops (Workload::iterate_*) ---------------------------------------------------------
    def run(self, passes: int) -> list[pb.Node]:
        kind = self.wl.parallelism
        loop = {
            "DATA": self._data, "MODEL": self._model, "MICRO": self._micro,
            "HYBRID_DATA_MODEL": self._hybrid, "HYBRID_MODEL_DATA": self._hybrid,
            "HYBRID_CUSTOMIZED": self._hybrid, "HYBRID_TRANSFORMER": self._hybrid,
            "HYBRID_TRANSFORMER_FWD_IN_BCKWD": self._hybrid,
            "HYBRID_DLRM": self._dlrm, "HYBRID_DLRM_ENHANCED": self._dlrm,
            "DISTRIBUTED_INFERENCE": self._inference,
        }[kind]
        self.wg_done: list[int | None] = [None] * len(self.wl.layers)
        self.ig_done: list[int | None] = [None] * len(self.wl.layers)
        for self.pass_index in range(passes):
            loop()
        return self.s.nodes

    def _micro(self) -> None:
        # iterate_micro_benchmark: weight-gradient collectives only, all issued at once.
        for index in range(len(self.wl.layers)):
            self.comm(index, "wg", blocking=False)

    def _data(self) -> None:
        n = len(self.wl.layers)
        for index in range(n):
            self.s.wait(self.wg_done[index])
            self.compute(index, "fwd")
        for index in range(n - 1, -1, -1):
            self.compute(index, "wg")
            self.wg_done[index] = self.comm(index, "wg", blocking=False)
            if index > 0:
                self.compute(index, "ig")

    def _model(self) -> None:
        n = len(self.wl.layers)
        for index in range(n):
            self.compute(index, "fwd")
            self.comm(index, "fwd", blocking=True)
        for index in range(n - 1, -1, -1):
            self.compute(index, "ig")
            pending = self.comm(index, "ig", blocking=False) if index > 0 else None
            self.compute(index, "wg")
            self.s.wait(pending)

    def _hybrid(self) -> None:
        n = len(self.wl.layers)
        transformer = self.wl.parallelism in TRANSFORMERS
        checkpoints = sorted(set(self.wl.checkpoints))
        initiators = set(self.wl.initiators)
        for index in range(n):
            self.s.wait(self.wg_done[index])
            self.compute(index, "fwd")
            self.comm(index, "fwd", blocking=True)
        for index in range(n - 1, -1, -1):
            if index in initiators:
                start = max(c for c in checkpoints if c < index)
                for layer in range(start, index):
                    self.compute(layer, "fwd", recompute=True)
                    self.comm(layer, "fwd", blocking=True)
            self.compute(index, "ig")
            pending = self.comm(index, "ig", blocking=False) if (index > 0 or transformer) else None
            self.compute(index, "wg")
            self.wg_done[index] = self.comm(index, "wg", blocking=False)
            self.s.wait(pending)

    def _dlrm(self) -> None:
        n = len(self.wl.layers)
        last_bottom = self.wl.last_bottom_layer
        fwd_done: list[int | None] = [None] * n
        for index in range(n):
            self.s.wait(self.wg_done[index])
            self.compute(index, "fwd")
            if self.wl.layers[index].comm_type["fwd"] == "ALLTOALL":
                fwd_done[index] = self.comm(index, "fwd", blocking=False)
            elif index == last_bottom:
                self.s.wait(fwd_done[0])
        for index in range(n - 1, -1, -1):
            self.compute(index, "wg")
            self.wg_done[index] = self.comm(index, "wg", blocking=False)
            if self.wl.parallelism == "HYBRID_DLRM":
                self.s.wait(self.ig_done[index])
                self.ig_done[index] = None
            if index == 0:
                break
            self.compute(index, "ig")
            if index == last_bottom + 1:
                self.ig_done[0] = self.comm(0, "ig", blocking=False)

    def _inference(self) -> None:
        for index in range(len(self.wl.layers)):
            self.compute(index, "fwd")
            self.comm(index, "fwd", blocking=True)


def convert_text_workload(workload: TextWorkload, num_npus: int, prefix: str | os.PathLike,
                          num_passes: int = 1, model_parallel_group: int | None = None,
                          first_dim_npus: int | None = None, compute_scale: float = 1.0,
                          comm_scale: float = 1.0, update_time: bool = True,
                          compress: bool = False) -> ConversionReport:
    """Write PREFIX.<rank>.et for `num_npus` NPUs running `num_passes` iterations of `workload`."""
    if num_npus < 1:
        raise TextWorkloadError("the number of NPUs must be at least 1")
    if num_passes < 1:
        raise TextWorkloadError("the number of passes must be at least 1")
    if compute_scale <= 0 or comm_scale <= 0:
        raise TextWorkloadError("--compute-scale and --comm-scale must be positive")
    kind = workload.parallelism
    layout = None
    notes: list[str] = []
    if kind in TRANSFORMERS:
        if first_dim_npus is not None:
            raise TextWorkloadError(f"{kind} groups NPUs by its model-parallel group (the header's "
                                    "model_parallel_NPU_group or --model-parallel-group), not "
                                    "--first-dim-npus")
        block = model_parallel_group or workload.model_parallel_group
        if num_npus % block:
            raise TextWorkloadError(f"{workload.path}: the model-parallel group of {block} NPUs does not "
                                    f"divide {num_npus} NPUs")
        layout = GroupLayout(num_npus, block)
    elif kind in ("HYBRID_DATA_MODEL", "HYBRID_MODEL_DATA", "HYBRID_CUSTOMIZED"):
        if model_parallel_group is not None:
            raise TextWorkloadError(f"--model-parallel-group applies to the transformer workloads; "
                                    f"{kind} groups NPUs by --first-dim-npus")
        block = first_dim_npus or default_first_dim(num_npus)
        if num_npus % block:
            raise TextWorkloadError(f"--first-dim-npus {block} does not divide {num_npus} NPUs")
        if first_dim_npus is None:
            notes.append(f"first network dimension: {block} NPUs (default; set it with --first-dim-npus)")
        layout = GroupLayout(num_npus, block)
    elif model_parallel_group is not None or first_dim_npus is not None:
        raise TextWorkloadError(f"{kind} runs its collectives among all NPUs; --model-parallel-group and "
                                "--first-dim-npus do not apply")
    per_layer_notes: dict = {}
    ranks = []
    programs = []
    for rank in range(num_npus):
        program = _RankProgram(workload, rank, layout, compute_scale, comm_scale, update_time,
                               per_layer_notes)
        ranks.append(program.run(num_passes))
        programs.append(program)
    first = programs[0]
    for index, layer in enumerate(workload.layers):
        for phase in PHASES:
            if layer.comm_type[phase] != "NONE" and (index, phase) not in first.reached:
                first._note(index, phase, f"not run: ASTRA-sim 1.0's {kind} loop never issues it")
    notes.extend(per_layer_notes[key] for key in sorted(per_layer_notes))
    if workload.ignored_lines:
        notes.append(f"lines after the {len(workload.layers)} announced layers were ignored "
                     f"(first: line {workload.ignored_lines[0]})")
    meta = metadata({
        "generator": "chakra-sim convert text",
        "source": Path(workload.path).name,
        "parallelism": kind,
        "num_npus": num_npus,
        "num_passes": num_passes,
        "time_unit": "duration_micros rounded to whole us; exact ns in the duration_ns attribute",
    })
    files = write_rank_files(prefix, ranks, meta, compress=compress)
    return ConversionReport(files=files, parallelism=kind, nodes_per_rank=[len(r) for r in ranks],
                            layout=layout, compute_ns=first.compute_ns,
                            compute_replay_ns=first.compute_replay_ns, compute_nodes=first.compute_nodes,
                            sub_500ns_nodes=first.sub_500, notes=notes)


# Command line -------------------------------------------------------------------------------------------
@click.command("text")
@click.argument("input_file", metavar="INPUT.txt", type=click.Path(dir_okay=False))
@click.option("--num-npus", required=True, type=click.IntRange(min=1), help="number of NPUs (ranks)")
@click.option("--num-passes", default=1, show_default=True, type=click.IntRange(min=1),
              help="training iterations to emit")
@click.option("--output", required=True, metavar="PREFIX", help="writes PREFIX.0.et ... PREFIX.<N-1>.et")
@click.option("--model-parallel-group", type=click.IntRange(min=1),
              help="transformer workloads: NPUs per model-parallel group (default: the file header's "
                   "model_parallel_NPU_group)")
@click.option("--first-dim-npus", type=click.IntRange(min=1),
              help="HYBRID_DATA_MODEL / HYBRID_MODEL_DATA / HYBRID_CUSTOMIZED: NPUs in ASTRA-sim's first "
                   "network dimension (default: the largest divisor of N not above sqrt(N))")
@click.option("--compute-scale", default=1.0, show_default=True, type=float,
              help="multiply compute times (ASTRA-sim 1.0's --compute-scale)")
@click.option("--comm-scale", default=1.0, show_default=True, type=float,
              help="multiply communication sizes (ASTRA-sim 1.0's --comm-scale)")
@click.option("--ignore-update-time", is_flag=True,
              help="drop the update-time column (as the official Chakra converter does)")
@click.option("--compress", is_flag=True, help="gzip the .et files")
def convert_text(input_file, num_npus, num_passes, output, model_parallel_group, first_dim_npus,
                 compute_scale, comm_scale, ignore_update_time, compress) -> None:
    """Convert an ASTRA-sim 1.0 text workload into one Chakra trace per NPU.

    Every ASTRA-sim 1.0 parallelism type is supported (DATA, MODEL,
    HYBRID_DATA_MODEL, HYBRID_MODEL_DATA, HYBRID_DLRM[_ENHANCED], MICRO,
    HYBRID_TRANSFORMER[_FWD_IN_BCKWD], HYBRID_CUSTOMIZED,
    DISTRIBUTED_INFERENCE). Compute times are ns; they are rounded to whole
    µs in duration_micros and kept exactly in the duration_ns attribute.

    \b
    Example:
      chakra-sim convert text Resnet50_DataParallel.txt --num-npus 8 \\
                 --num-passes 2 --output traces/resnet50
      chakra-sim run --workload traces/resnet50 --astra-system sys.json \\
                 --astra-network net.yml
    """
    with tool_errors(f"{output}.<rank>.et"):
        workload = parse_text_workload(input_file)
        report = convert_text_workload(workload, num_npus, output, num_passes=num_passes,
                                       model_parallel_group=model_parallel_group,
                                       first_dim_npus=first_dim_npus, compute_scale=compute_scale,
                                       comm_scale=comm_scale, update_time=not ignore_update_time,
                                       compress=compress)
    echo = click.echo
    echo(f"{input_file}: {report.parallelism}, {len(workload.layers)} layer(s), {num_passes} pass(es), "
         f"{num_npus} NPU(s)")
    if report.layout is not None:
        layout = report.layout
        echo(f"groups: block<i> = NPUs {layout.block}i .. {layout.block}i+{layout.block - 1}; "
             f"stride<j> = NPUs j, j+{layout.block}, j+{2 * layout.block}, ... "
             f"({num_npus // layout.block} per group)")
    if report.compute_nodes:
        change = (report.compute_replay_ns - report.compute_ns) / report.compute_ns * 100
        echo(f"compute per NPU: {report.compute_ns:,} ns exact, {report.compute_replay_ns:,} ns replayed "
             f"from whole-µs durations ({change:+.3f}%); {report.sub_500ns_nodes} of "
             f"{report.compute_nodes} compute node(s) are shorter than 500 ns (exact ns in duration_ns)")
    for note in report.notes:
        echo(f"note: {note}")
    first, last = report.files[0], report.files[-1]
    shown = str(first) if len(report.files) == 1 else f"{first} ... {last}"
    echo(f"wrote {shown} ({report.nodes_per_rank[0]} nodes on rank 0)")
