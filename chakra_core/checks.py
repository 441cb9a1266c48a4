"""What `chakra-sim run` would reject, found without simulating (`chakra-sim validate`).

Beyond the manifest itself (checked when it loads), `check_run` looks at:

- the layers: they are built as for a run (the `Simulation` constructor, which
  runs no event), so a network whose NPU count differs from the number of
  trace files, or a plugin that refuses its settings, is reported;
- every trace file: one streaming pass, as the streaming feeder indexes it
  (plain or gzip): truncated or corrupt files, duplicate node ids, dependencies
  on missing nodes, dependency cycles;
- memory nodes (MEM_LOAD/MEM_STORE) in a run without a memory layer;
- collectives: the native system layer matches the k-th collective a rank
  issues in a communicator group (`pg_name`; none, "" or "0" is all ranks)
  with the k-th of every other member, and they must agree in `comm_type` and
  `comm_size` (BARRIER sizes are ignored). A rank's issue order depends on
  simulated timing (of the nodes ready at once the smallest id issues first,
  but a collective can become ready before one with a smaller id), so the
  check compares each rank's collectives in node-id order: a trace that
  relies on timing to order its collectives can pass here and still mismatch
  in a run. Also: a group that is not defined, a rank using a group it is not
  a member of, members issuing different numbers of collectives in a group
  (the run would wait forever), unknown collective types;
- the output folder: that a run could create it and write there.

Each problem is one line naming the file, the rank and the node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from chakra_core.errors import ChakraSimError
from chakra_core.feeder import CPU_FLAG, StreamingFeeder
from chakra_core.schema import pb

MEMORY_NODES = (pb.MEM_LOAD_NODE, pb.MEM_STORE_NODE)
COLLECTIVE_TYPES = frozenset(pb.CollectiveCommType.values())


@dataclass
class _Collective:
    id: int          # `id` and `name`, as GroupRegistry.members reads them from a node
    name: str
    comm_type: int
    size: int
    group: str


@dataclass
class _RankScan:
    rank: int
    path: Path
    collectives: list[_Collective] = field(default_factory=list)
    first_memory_node: int | None = None


def check_run(loaded, host) -> tuple[list[str], list[str]]:
    """(problems, warnings) of a loaded manifest, found without simulating (see module docstring)."""
    from chakra_core.engine.simulation import Simulation
    from chakra_core.report.writers import output_dir_problem
    from chakra_core.system.groups import GroupRegistry

    spec = loaded.spec
    problems: list[str] = []
    warnings: list[str] = list(spec.warnings)
    try:
        Simulation(spec, host)
    except ChakraSimError as exc:
        problems.append(f"{loaded.source}: {exc}")

    registry = None
    try:
        registry = GroupRegistry(len(spec.trace_files), spec.comm_groups)
    except ChakraSimError as exc:
        if not any(str(exc) in problem for problem in problems):   # the system layer may have said it
            problems.append(f"{loaded.source}: workload.comm_groups: {exc}")
    scans = []
    for rank, path in enumerate(spec.trace_files):
        scan = _scan(rank, path, spec, registry, problems, warnings)
        if scan is not None:
            scans.append(scan)
            if scan.first_memory_node is not None and "memory" not in spec.layers:
                problems.append(f"{path} (rank {rank}), node {scan.first_memory_node}: memory "
                                "loads/stores need a memory layer (a `memory:` section, e.g. "
                                "plugin: hbm)")
    if registry is not None and len(scans) == len(spec.trace_files):
        problems.extend(_collective_problems(scans, registry))
    problem = output_dir_problem(loaded.output_dir)
    if problem:
        problems.append(problem)
    return problems, warnings


def _scan(rank: int, path: Path, spec, registry, problems: list[str],
          warnings: list[str]) -> _RankScan | None:
    """Read one rank's trace as the streaming feeder does; list its collectives in id order."""
    try:
        feeder = StreamingFeeder(path, cache_nodes=spec.cache_nodes,
                                 missing_parents=spec.missing_parents, dependencies=spec.dependencies)
    except ChakraSimError as exc:
        problems.append(f"rank {rank}: {exc}")
        return None
    scan = _RankScan(rank, path)
    try:
        warnings.extend(feeder.warnings)
        for node_id in sorted(feeder.pending_nodes()):
            kind = feeder.node_kind(node_id) & ~CPU_FLAG
            if kind == pb.COMM_COLL_NODE:
                node = feeder.lookup_node(node_id)
                try:
                    comm_type = node.int("comm_type")
                    size = 0 if comm_type == pb.BARRIER else node.int("comm_size", 0)
                    group = node.str("pg_name", "")
                except ChakraSimError as exc:
                    problems.append(f"{path} (rank {rank}): {exc}")
                    continue
                if comm_type not in COLLECTIVE_TYPES:
                    problems.append(f"{path} (rank {rank}), node {node_id} ({node.name!r}): unknown "
                                    f"collective type {comm_type}")
                    continue
                scan.collectives.append(_Collective(node_id, node.name, comm_type, size,
                                                    "" if group == "0" else group))
            elif kind == pb.METADATA_NODE and registry is not None:
                try:
                    registry.define_from_metadata(rank, feeder.lookup_node(node_id))
                except ChakraSimError as exc:
                    problems.append(f"{path}: {exc}")
            elif kind in MEMORY_NODES and scan.first_memory_node is None:
                scan.first_memory_node = node_id
    except ChakraSimError as exc:   # a body that indexed but does not decode
        problems.append(f"rank {rank}: {exc}")
        return None
    finally:
        feeder.close()
    return scan


def _type_name(comm_type: int) -> str:
    return pb.CollectiveCommType.Name(comm_type)


def _collective_problems(scans: list[_RankScan], registry) -> list[str]:
    """The k-th collective of each group must agree across its members (see module docstring)."""
    problems: list[str] = []
    paths = {scan.rank: scan.path for scan in scans}
    by_group: dict[str, dict[int, list[_Collective]]] = {}
    for scan in scans:
        for coll in scan.collectives:
            by_group.setdefault(coll.group, {}).setdefault(scan.rank, []).append(coll)
    for group in sorted(by_group):
        issued = by_group[group]
        where = f"group '{group}'" if group else "all ranks"
        members = None
        for rank in sorted(issued):
            try:
                found = tuple(registry.members(group, issued[rank][0], rank))
            except ChakraSimError as exc:
                problems.append(f"{paths[rank]}: {exc}")
                continue
            members = found
        if members is None:
            continue
        reference = members[0]
        expected = issued.get(reference, [])
        for rank in members[1:]:
            mine = issued.get(rank, [])
            mismatch = next((k for k, (a, b) in enumerate(zip(mine, expected))
                             if (a.comm_type, a.size) != (b.comm_type, b.size)), None)
            if mismatch is not None:
                a, b = mine[mismatch], expected[mismatch]
                problems.append(
                    f"{paths[rank]} (rank {rank}), node {a.id} ({a.name!r}): collective "
                    f"#{mismatch + 1} in {where} is {_type_name(a.comm_type)} of {a.size} B, but "
                    f"rank {reference}'s (node {b.id}) is {_type_name(b.comm_type)} of {b.size} B")
            elif len(mine) != len(expected):
                more, fewer = (rank, reference) if len(mine) > len(expected) else (reference, rank)
                extra = issued.get(more, [])[len(issued.get(fewer, []))]
                problems.append(
                    f"{paths.get(rank)} (rank {rank}): issues {len(mine)} collective(s) in {where}, "
                    f"rank {reference} issues {len(expected)}; rank {more}'s node {extra.id} "
                    f"({extra.name!r}) would wait forever for rank {fewer}")
    return problems
