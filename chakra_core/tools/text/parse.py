"""Reading ASTRA-sim 1.0 text workloads (`parse_text_workload`).

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
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from chakra_core.errors import ChakraSimError, InputFileError
from chakra_core.input_files import read_input_text
from chakra_core.schema import pb


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
    if not -(1 << 63) <= value < 1 << 63:   # ASTRA-sim reads 64-bit integers; so does a trace
        raise TextWorkloadError(f"{where}: {what} {value} does not fit a 64-bit integer")
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


def parse_text_workload(path: str | os.PathLike[str]) -> TextWorkload:
    """Read an ASTRA-sim 1.0 text workload; raise TextWorkloadError naming the line on any problem."""
    spath = str(path)
    try:
        text = read_input_text(path, "text workload", errors="replace")
    except InputFileError as exc:
        raise TextWorkloadError(str(exc)) from None
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
