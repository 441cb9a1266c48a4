"""`chakra-sim obfuscate`: a trace that simulates like the source but tells nothing about it.

What is written, per rank:
- the same nodes and dependencies, renumbered 0..n-1 in file order (references to missing
  parents are dropped and counted);
- no operator name (names are empty), no op schema, no tensor shape, type or value
  (`inputs`/`outputs` are cleared), no string attribute, no start time, no storage info;
- of the attributes, only those the simulator reads (`KEPT_ATTRIBUTES`), as numbers;
- communicator groups renamed `group0`, `group1`, ... in order of first use, consistently on
  every rank (the METADATA node defining them rewritten; `--comm-group` files renamed too);
- durations, num_ops and tensor_size multiplied by a factor within ±tolerance, drawn per
  node from the seed; message sizes (`comm_size`) by a factor that depends only on the size,
  so the members of a collective and the two ends of a send still agree;
- GlobalMetadata with the version only.

The memory model's tensor tracking reads `inputs`/`outputs`: an obfuscated trace has none,
so `hbm` reports peak memory as unknown.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import click

from chakra_core._atomic import atomic_write_text
from chakra_core.errors import ChakraSimError
from chakra_core.et.attrs import INT_FIELDS, NodeView, attr_map, attr_value
from chakra_core.cli.output import CliError, tool_errors
from chakra_core.comm.groups import WORLD, parse_pg_list
from chakra_core.et.io import read_trace, write_trace
from chakra_core.et.jsonize import rank_files
from chakra_core.et.rank_files import RankFiles
from chakra_core.schema import pb

DEFAULT_TOLERANCE = 0.05
SIZE_ATTRIBUTES = ("num_ops", "tensor_size")
KEPT_ATTRIBUTES = ("is_cpu_op", "comm_type", "comm_size", "comm_src", "comm_dst", "comm_tag", "pg_name",
                   "involved_dim", "num_ops", "tensor_size", "root_rank", "root", "comm_root")
"""What the simulator reads; every other attribute is dropped."""


def _unit(seed: int, key: tuple[object, ...]) -> float:
    """A number in [0, 1) fixed by (seed, key): the same on every machine and run."""
    digest = hashlib.sha256(repr((seed, *key)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def perturbed(seed: int, tolerance: float, *key: object) -> float:
    """A factor in [1 - tolerance, 1 + tolerance] fixed by the seed and key."""
    return 1.0 + tolerance * (2.0 * _unit(seed, key) - 1.0)


def perturbed_size(seed: int, tolerance: float, size: int) -> int:
    """A message size within ±tolerance of `size`, the same wherever `size` appears (the members
    of a collective must agree); equal sizes stay equal."""
    return max(0, round(size * perturbed(seed, tolerance, "size", int(size))))


class GroupNames:
    """Source communicator-group names -> neutral names, shared by every rank."""

    def __init__(self, avoid: set[str]):
        self.avoid = avoid
        self.names: dict[str, str] = {}

    def rename(self, name: str) -> str:
        if name == WORLD:
            return name
        if name not in self.names:
            index = len(self.names)
            new = f"group{index}"
            while new in self.avoid:     # never reuse a string of the source
                new = "_" + new
            self.names[name] = new
        return self.names[name]


def source_strings(metadata: pb.GlobalMetadata | None, nodes: list[pb.Node]) -> set[str]:
    """Every string a trace carries (names, string attributes, inputs/outputs, metadata)."""
    found: set[str] = set()
    messages: list[pb.Node | pb.GlobalMetadata] = list(nodes)
    for node in nodes:
        found.add(node.name)
        for info in (node.inputs, node.outputs):
            found.update(s for s in (info.values, info.shapes, info.types) if s)
    if metadata is not None:
        messages.append(metadata)
    for message in messages:
        for attr in message.attr:
            found.add(attr.name)
            value = attr_value(attr)
            if isinstance(value, str):
                found.add(value)
            elif isinstance(value, list):
                found.update(v for v in value if isinstance(v, str))
    found.discard("")
    return found


def _defined_groups(nodes: list[pb.Node]) -> list[tuple[str, list[int]]]:
    out: list[tuple[str, list[int]]] = []
    for node in nodes:
        if node.type == pb.METADATA_NODE and "pg_name" in node.inputs.values:
            parsed = parse_pg_list(node.inputs.values.strip()) or []
            out.extend((entry.name, list(entry.ranks)) for entry in parsed)
    return out


def obfuscate_node(node: pb.Node, new_id: int, renumber: dict[int, int], groups: GroupNames,
                   defined: set[str], seed: int, tolerance: float, rank: int) -> pb.Node:
    view = NodeView(node)
    out = pb.Node(id=new_id, type=node.type)
    out.data_deps.extend(renumber[p] for p in dict.fromkeys(node.data_deps) if p in renumber)
    out.ctrl_deps.extend(renumber[p] for p in dict.fromkeys(node.ctrl_deps) if p in renumber)
    if node.duration_micros:
        out.duration_micros = round(node.duration_micros * perturbed(seed, tolerance, "duration", rank, new_id))
    if node.type == pb.METADATA_NODE and "pg_name" in node.inputs.values:
        entries = [{"pg_name": groups.rename(name), "ranks": ranks} for name, ranks in _defined_groups([node])]
        out.inputs.values = json.dumps(entries, separators=(",", ":"))
    attrs = attr_map(node)
    for name in KEPT_ATTRIBUTES:
        attr = attrs.get(name)
        if attr is None:
            continue
        which = attr.WhichOneof("value")
        if name == "pg_name":
            group = view.str(name)
            kept = group if group == "0" and group not in defined else groups.rename(group)
            out.attr.append(pb.AttributeProto(name=name, string_val=kept))
        elif name == "is_cpu_op":
            out.attr.append(pb.AttributeProto(name=name, bool_val=view.bool(name)))
        elif name == "involved_dim":
            out.attr.append(pb.AttributeProto(name=name, bool_list=pb.BoolList(values=view.bool_list(name))))
        else:
            value = view.int(name)
            if name == "comm_size":
                value = perturbed_size(seed, tolerance, value)
            elif name in SIZE_ATTRIBUTES:
                value = round(value * perturbed(seed, tolerance, name, rank, new_id))
            field = which if which in INT_FIELDS else "int64_val"
            if value < 0 and field.startswith(("uint", "fixed")):
                field = "int64_val"
            bits = (32 if "32" in field else 64) - (0 if field.startswith(("uint", "fixed")) else 1)
            value = min(value, (1 << bits) - 1)   # a size perturbed up stays within its field
            attr_out = pb.AttributeProto(name=name)
            setattr(attr_out, field, value)
            out.attr.append(attr_out)
    return out


@dataclass(frozen=True)
class ObfuscationReport:
    """What `obfuscate_traces` wrote."""

    ranks: int
    nodes: int
    dropped_parent_references: int
    """References to parents the source trace does not hold, left out of the copy."""
    groups_renamed: int
    files: list[str]


def obfuscate_traces(prefix: str, out_prefix: str, seed: int = 0, tolerance: float = DEFAULT_TOLERANCE,
                     comm_groups: dict[str, list[int]] | None = None) -> ObfuscationReport:
    """Write the obfuscated copy of every rank of `prefix` to `out_prefix`; return a report."""
    if not 0 <= tolerance < 1:
        raise ChakraSimError(f"the tolerance must be in [0, 1), got {tolerance}")
    files = rank_files(prefix)
    outputs = [Path(f"{out_prefix}.{rank}.et") for rank in range(len(files))]
    for source, target in zip(files, outputs):
        if target.exists() and target.resolve() == source.resolve():
            raise ChakraSimError(f"{target} is a source file: give another --out prefix")
    # First pass: the group names used and defined, and every string (new names avoid them).
    avoid: set[str] = set()
    defined: set[str] = set(comm_groups or {})
    for path in files:
        trace = read_trace(path)
        avoid |= source_strings(trace.metadata, trace.nodes)
        defined.update(name for name, _ in _defined_groups(trace.nodes))
    groups = GroupNames(avoid)
    dropped = 0
    nodes_written = 0
    with RankFiles(out_prefix, len(files), "ranks") as staged:   # all ranks, or none
        for rank, path in enumerate(files):
            trace = read_trace(path)
            renumber = {node.id: index for index, node in enumerate(trace.nodes)}
            out_nodes = []
            for index, node in enumerate(trace.nodes):
                out = obfuscate_node(node, index, renumber, groups, defined, seed, tolerance, rank)
                dropped += (len(set(node.data_deps)) + len(set(node.ctrl_deps))
                            - len(out.data_deps) - len(out.ctrl_deps))
                out_nodes.append(out)
            write_trace(staged.path(rank), pb.GlobalMetadata(version=trace.metadata.version), out_nodes)
            nodes_written += len(out_nodes)
        written = [str(p) for p in staged.commit()]
    if comm_groups:
        renamed = {groups.rename(str(name)): list(ranks) for name, ranks in comm_groups.items()}
        path = Path(f"{out_prefix}.comm-groups.json")
        atomic_write_text(path, json.dumps(renamed, indent=1) + "\n")
        written.append(str(path))
    return ObfuscationReport(len(files), nodes_written, dropped, len(groups.names), written)


def read_comm_groups(path: str | None) -> dict[str, list[int]] | None:
    """An ASTRA-sim communicator-group JSON ({"name": [ranks]}), or None."""
    if path is None:
        return None
    from chakra_core.config.astra import read_comm_groups as read_astra_comm_groups

    return read_astra_comm_groups(Path(path))


@click.command("obfuscate")
@click.argument("prefix")
@click.option("--out", "out_prefix", required=True, metavar="OUTPREFIX", help="prefix of the obfuscated files (OUTPREFIX.<rank>.et)")
@click.option("--seed", type=int, default=0, show_default=True, metavar="S", help="seed of the perturbations")
@click.option("--tolerance", type=float, default=DEFAULT_TOLERANCE, show_default=True, metavar="T",
              help="durations and sizes move by at most this fraction")
@click.option("--comm-group", "comm_group", type=click.Path(dir_okay=False),
              help="communicator-group JSON of the source (written renamed to OUTPREFIX.comm-groups.json)")
@click.option("--debug", is_flag=True, help="show tracebacks")
def obfuscate(prefix: str, out_prefix: str, seed: int, tolerance: float, comm_group: str | None,
              debug: bool) -> None:
    """Copy a trace with every name, string and shape removed and its values perturbed.

    \b
    Example:
      chakra-sim obfuscate traces/dlrm --out shared/dlrm --tolerance 0.05
    """
    if not 0 <= tolerance < 1:
        raise CliError(f"--tolerance must be in [0, 1), got {tolerance}")
    with tool_errors(f"{out_prefix}.<rank>.et", debug):
        report = obfuscate_traces(prefix, out_prefix, seed, tolerance, read_comm_groups(comm_group))
    click.echo(f"wrote {report.ranks} rank(s), {report.nodes:,} nodes to {out_prefix}.<rank>.et "
               f"({report.groups_renamed} communicator group(s) renamed"
               + (f", {report.dropped_parent_references} reference(s) to missing parents dropped"
                  if report.dropped_parent_references else "") + ")")
    if comm_group:
        click.echo(f"wrote {report.files[-1]}")
