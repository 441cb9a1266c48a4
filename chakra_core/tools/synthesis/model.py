"""The synthesis model: what `chakra-sim synthesize` learns from traces and samples from.

A small JSON document (`--model FILE`), validated with pydantic when loaded. It holds
statistics, not the trace: no node ids, no operator names unless the model keeps them
(a bin's most common `name`; never with `--obfuscate`), no tensor shapes, no string
attributes. Durations are in ns (`duration_ns` attributes where the source has them, else
`duration_micros` x 1000).

- `groups`: communicator groups as rank lists of the source (`null`: every rank).
- `ranks`: per source rank, its role and the groups it uses, in first-use order ("slots").
- `roles`: ranks whose programs are alike (same communication, in the same order, with the
  same sizes, slots and relative peers) share a role. A role has
  - `anchors`: its communication operations in program order. Collective members and
    send/receive pairs must agree, so these are kept exactly (sizes perturbed with
    `--obfuscate`, consistently on every member), each with the positions after it of the
    nodes that wait for it (`consumers`): where a collective sits on the critical path;
  - `gaps`: what lies between consecutive anchors (before the first, between each pair, after
    the last), window by window (32 source nodes each): the mean number of nodes of each class,
    and in `gap_ns` their mean total duration. How much work separates two collectives decides
    how much of them is hidden, and the windows keep the mix's course through a long gap;
  - `transitions`: how often a node class follows another (program order), from which the
    order of nodes inside a gap is drawn;
  - `classes`: per node class, a value distribution (`bins`: one per distinct value when there are at
    most 64, else equal-count bins of the source nodes sorted by duration, num_ops,
    tensor_size; each with its count and means) and a dependency distribution (`parents`:
    patterns of parents other than anchors, by the class of the node before, the position after
    the last anchor and that anchor's class (the first node of a rank has no parents, the node after it has), each parent named by its lane and how recent it is
    in that lane: ["gpu", 1] is the latest GPU node before this one).

A *class* is a node type, with "/cpu" for CPU operations and the collective type for
collectives ("COMP_NODE", "COMP_NODE/cpu", "COMM_COLL_NODE/ALL_REDUCE", ...). A *lane* is
the hardware resource a node of a class runs on in the simulator ("cpu", "gpu", "comm", "memory",
"unlimited": chakra_core.engine.driver.SLOT_NAMES).
"""

from __future__ import annotations

import json
import os
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from chakra_core._atomic import atomic_write_text
from chakra_core.errors import ChakraSimError, InputFileError
from chakra_core.feeder.base import CPU_FLAG
from chakra_core.input_files import read_input_text
from chakra_core.schema import pb

MODEL_FORMAT = "chakra-sim-synthesis-model"
MODEL_VERSION = 1


class SynthesisError(ChakraSimError):
    """A model or source that cannot be synthesized from (bad file, inconsistent traces)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Anchor(_Strict):
    """One communication operation of a role's program."""

    cls: str
    comm_type: Optional[int] = None
    size: Optional[int] = Field(default=None, ge=0)
    slot: Optional[int] = Field(default=None, ge=0, description="index into the rank's groups")
    peer: Optional[int] = Field(default=None, description="partner rank minus own rank")
    tag: Optional[int] = None
    involved_dim: Optional[list[bool]] = None
    duration_ns: int = Field(default=0, ge=0)
    parents: list[tuple[str, int]] = Field(default_factory=list)
    consumers: list[int] = Field(default_factory=list, description="positions after the anchor of "
                                 "the nodes that depend on it (1: the next node)")


class Bin(_Strict):
    """Source nodes of one equal-count bin: how many, and their mean values."""

    count: int = Field(ge=1)
    duration_ns: float = Field(ge=0)
    num_ops: Optional[float] = Field(default=None, ge=0)
    tensor_size: Optional[float] = Field(default=None, ge=0)
    name: Optional[str] = None


def class_kind(cls: str) -> int:
    """The node kind (NodeType value, | CPU_FLAG for "/cpu") a class name stands for: the inverse
    of `fit.node_class` ("TYPE_<n>" for a type this schema does not name). ValueError if none."""
    type_name = cls.split("/", 1)[0]
    node_type = int(type_name[5:]) if type_name.startswith("TYPE_") else pb.NodeType.Value(type_name)
    return node_type | (CPU_FLAG if cls.endswith("/cpu") else 0)


class NodeClass(_Strict):
    bins: list[Bin]
    parents: list[tuple[str, int, str, list[tuple[str, int]], int]] = Field(
        default_factory=list, description="(class of the node before, position after the last anchor "
        "(at most 16), class of that anchor, pattern, how many source nodes had it)")
    exact_ns: bool = Field(default=False, description="write duration_ns attributes (the source had them)")


class Role(_Strict):
    ranks: int = Field(ge=1, description="source ranks pooled into this role")
    anchors: list[Anchor]
    gaps: list[list[dict[str, float]]]
    gap_ns: list[list[dict[str, float]]] = Field(description="mean total duration per class in each window")
    transitions: dict[str, dict[str, int]]
    classes: dict[str, NodeClass]

    @model_validator(mode="after")
    def _consistent(self) -> "Role":
        if len(self.gaps) != len(self.anchors) + 1:
            raise ValueError(f"a role with {len(self.anchors)} anchors needs {len(self.anchors) + 1} "
                             f"gaps, found {len(self.gaps)}")
        if [len(g) for g in self.gap_ns] != [len(g) for g in self.gaps]:
            raise ValueError("gap_ns must have the windows of gaps")
        for cls in [*self.classes, *(anchor.cls for anchor in self.anchors)]:
            try:
                class_kind(cls)
            except ValueError:
                raise ValueError(f"{cls!r} is not a node class (a NodeType name, TYPE_<n>, then "
                                 "optional /<collective type> and /cpu)") from None
        for gap in [window for gap in [*self.gaps, *self.gap_ns] for window in gap]:
            unknown = sorted(set(gap) - set(self.classes))
            if unknown:
                raise ValueError(f"gap counts name unknown classes {unknown}")
        return self


class RankEntry(_Strict):
    role: int = Field(ge=0)
    groups: list[int] = Field(default_factory=list)


class SynthesisModel(_Strict):
    format: str = MODEL_FORMAT
    version: int = MODEL_VERSION
    obfuscated: bool = False
    tolerance: float = Field(default=0.0, ge=0, lt=1)
    source_nodes: int = Field(ge=0, description="nodes per rank of the source, on average")
    unmodelled_dependencies: int = Field(default=0, ge=0, description="parent references of the source "
                                         "not modelled: to missing nodes, or more than 64 back in their lane")
    groups: list[Optional[list[int]]]
    ranks: list[RankEntry]
    roles: list[Role]

    @model_validator(mode="after")
    def _references(self) -> "SynthesisModel":
        if self.format != MODEL_FORMAT:
            raise ValueError(f"format must be {MODEL_FORMAT!r}")
        if self.version != MODEL_VERSION:
            raise ValueError(f"model version {self.version} is not supported (this chakra-sim "
                             f"reads version {MODEL_VERSION})")
        for rank, entry in enumerate(self.ranks):
            if entry.role >= len(self.roles):
                raise ValueError(f"ranks[{rank}].role {entry.role} does not exist")
            bad = [g for g in entry.groups if g >= len(self.groups)]
            if bad:
                raise ValueError(f"ranks[{rank}].groups names missing groups {bad}")
            for anchor in self.roles[entry.role].anchors:
                if anchor.slot is not None and anchor.slot >= len(entry.groups):
                    raise ValueError(f"ranks[{rank}]: an anchor uses group slot {anchor.slot}, "
                                     f"the rank has {len(entry.groups)}")
        for index, members in enumerate(self.groups):
            if members is not None and any(not 0 <= m < len(self.ranks) for m in members):
                raise ValueError(f"groups[{index}] names ranks outside 0..{len(self.ranks) - 1}")
        return self

    @property
    def num_ranks(self) -> int:
        return len(self.ranks)


def save_model(model: SynthesisModel, path: str | os.PathLike[str]) -> None:
    atomic_write_text(path, model.model_dump_json(exclude_none=True) + "\n")


def load_model(path: str | os.PathLike[str]) -> SynthesisModel:
    try:
        data = json.loads(read_input_text(path, "synthesis model"))
    except InputFileError as exc:
        raise SynthesisError(str(exc)) from None
    except ValueError as exc:
        raise SynthesisError(f"{path}: not a JSON synthesis model: {exc}") from None
    except RecursionError:
        raise SynthesisError(f"{path}: not a JSON synthesis model: nested too deeply to read") from None
    try:
        return SynthesisModel.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top level)"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise SynthesisError(f"{path}: {where}: {first['msg']}{more}") from None
