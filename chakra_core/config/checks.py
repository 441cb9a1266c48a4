"""What a run's traces would make `chakra-sim run` reject, found without simulating.

`chakra_core.run.validate` builds the layers as for a run (which checks the
settings and that the network has one NPU per trace file), then calls
`check_traces`, which looks at:

- every trace file: one streaming pass, as the streaming feeder indexes it
  (plain or gzip): truncated or corrupt files, duplicate node ids, dependencies
  on missing nodes, dependency cycles;
- memory nodes (MEM_LOAD/MEM_STORE) in a run without a memory layer;
- collectives, read as the selected system layer reads them
  (`SystemLayer.collective_call`) and matched by the same matcher a run uses
  (chakra_core.comm.matcher): the k-th collective a rank issues in a
  communicator group meets the k-th of every other member, and they must
  agree in type and size. A rank's issue order depends on simulated timing
  (of the nodes ready at once the smallest id issues first, but a collective
  can become ready before one with a smaller id), so the check feeds each
  rank's collectives in node-id order: a trace that relies on timing to order
  its collectives can pass here and still mismatch in a run. Also: a group
  that is not defined, a rank using a group it is not a member of, members
  issuing different numbers of collectives in a group (the run would wait
  forever), unknown collective types. A system layer that does not match
  collectives per group (`collective_call` returns None) skips this part.

Each problem is one line naming the file, the rank and the node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from chakra_core.comm.collectives import CollectiveCall, collective_name, even_pieces
from chakra_core.comm.groups import GroupRegistry
from chakra_core.comm.matcher import CollectiveMatcher, OpenCollective
from chakra_core.config.spec import RunSpec
from chakra_core.contract.layers import SystemLayer
from chakra_core.errors import ChakraSimError
from chakra_core.et.attrs import NodeView
from chakra_core.et.duration import replay_time_ns
from chakra_core.feeder import CPU_FLAG, StreamingFeeder
from chakra_core.limits import TIME_NS
from chakra_core.schema import pb

MEMORY_NODES = (pb.MEM_LOAD_NODE, pb.MEM_STORE_NODE)


@dataclass
class _RankScan:
    rank: int
    path: Path
    collectives: list[tuple[NodeView, CollectiveCall]] = field(default_factory=list)
    first_memory_node: int | None = None


def check_traces(spec: RunSpec, system: type[SystemLayer] | None, source: str, problems: list[str],
                 warnings: list[str]) -> None:
    """Append what the traces of `spec` would make a run with `system` reject (module docstring);
    `source` names the manifest."""
    registry = None
    try:
        registry = GroupRegistry(len(spec.trace_files), spec.comm_groups)
    except ChakraSimError as exc:
        if not any(str(exc) in problem for problem in problems):   # the system layer may have said it
            problems.append(f"{source}: workload.comm_groups: {exc}")
    scans = []
    # A generated job's classes are known: only representatives have traces of their own, and
    # their collectives match those of the ranks they stand for by construction.
    ranks = spec.folding.representatives if spec.folding is not None else range(len(spec.trace_files))
    for rank in ranks:
        path = spec.trace_files[rank]
        scan = _scan(rank, path, spec, system, registry, problems, warnings)
        if scan is not None:
            scans.append(scan)
            if scan.first_memory_node is not None and "memory" not in spec.layers:
                problems.append(f"{path} (rank {rank}), node {scan.first_memory_node}: memory "
                                "loads/stores need a memory layer (a `memory:` section; "
                                "`chakra-sim plugins --layer memory` lists them)")
    if registry is not None and system is not None and len(scans) == len(spec.trace_files):
        problems.extend(_collective_problems(scans, registry, getattr(system, "uneven_all_to_all_refusal", None)))


def _scan(rank: int, path: Path, spec: RunSpec, system: type[SystemLayer] | None,
          registry: GroupRegistry | None, problems: list[str], warnings: list[str]) -> _RankScan | None:
    """Read one rank's trace as the streaming feeder does; list its collectives in id order."""
    try:
        feeder = StreamingFeeder(path, cache_nodes=spec.cache_nodes,
                                 missing_parents=spec.missing_parents, dependencies=spec.dependencies)
    except ChakraSimError as exc:
        problems.append(f"rank {rank}: {exc}")
        return None
    scan = _RankScan(rank, path)
    compute = spec.layers.get("compute")
    replayed, max_ns = compute is not None and compute.impl.name == "replay", TIME_NS.value()
    try:
        warnings.extend(feeder.warnings)
        for node_id in sorted(feeder.pending_nodes()):
            kind = feeder.node_kind(node_id) & ~CPU_FLAG
            if kind == pb.COMM_COLL_NODE and system is not None:
                node = feeder.lookup_node(node_id)
                try:
                    call = system.collective_call(rank, node, warnings.append)
                except ChakraSimError as exc:
                    problems.append(f"{path} (rank {rank}), " + _without_rank(str(exc), rank))
                    continue
                if call is not None:
                    scan.collectives.append((node, call))
            elif kind == pb.METADATA_NODE and registry is not None:
                try:
                    registry.define_from_metadata(rank, feeder.lookup_node(node_id))
                except ChakraSimError as exc:
                    problems.append(f"{path}: {exc}")
            elif kind in MEMORY_NODES and scan.first_memory_node is None:
                scan.first_memory_node = node_id
            elif kind == pb.COMP_NODE and replayed and replay_time_ns(feeder.lookup_node(node_id)) > max_ns:
                # what a run's time limit refuses first (it also refuses sums beyond it)
                problems.append(f"{path} (rank {rank}), node {node_id}: traced duration "
                                f"{replay_time_ns(feeder.lookup_node(node_id)):,} ns; {TIME_NS.hint()}")
    except ChakraSimError as exc:   # a body that indexed but does not decode
        problems.append(f"rank {rank}: {exc}")
        return None
    finally:
        feeder.close()
    return scan


def _without_rank(message: str, rank: int) -> str:
    """"rank 3, node 1 (...): ..." -> "node 1 (...): ..." (the caller names the rank with the file)."""
    prefix = f"rank {rank}, "
    return message[len(prefix):] if message.startswith(prefix) else message


def _collective_problems(scans: list[_RankScan], registry: GroupRegistry, uneven_refusal: str | None = None
                         ) -> list[str]:
    """The k-th collective of each group must agree across its members (see module docstring)."""
    by_group: dict[str, list[str]] = {}     # problems, reported group by group
    paths = {scan.rank: scan.path for scan in scans}
    names: dict[tuple[int, int], str] = {}
    matcher: CollectiveMatcher[OpenCollective] = CollectiveMatcher(registry, OpenCollective)
    stopped: set[tuple[int, str]] = set()      # (rank, group) past its first problem
    refused: set[str] = set()                   # groups with an uneven all-to-all the layer refuses
    for scan in scans:
        rank = scan.rank
        for node, call in scan.collectives:
            if (rank, call.group) in stopped:
                continue
            names[(rank, node.id)] = node.name
            try:
                coll = matcher.join(rank, node, call)
                if uneven_refusal is not None and coll.splits is not None and not even_pieces(coll.splits.get(rank)) \
                        and call.group not in refused:
                    refused.add(call.group)   # the group's first one says it
                    by_group.setdefault(call.group, []).append(f"{paths[rank]} (rank {rank}), node {node.id}: "
                                                               f"{uneven_refusal}")
            except ChakraSimError as exc:
                stopped.add((rank, call.group))
                problems = by_group.setdefault(call.group, [])
                seq = matcher.issued[rank].get(call.group, 0) - 1
                first = matcher.open.get((call.group, seq))
                if first is None or seq < 0 or call.splits is not None:   # not a member, an undefined group,
                    # or an uneven all-to-all whose pieces disagree (the error says which)
                    problems.append(f"{paths[rank]}: {exc}")
                    continue
                where = f"group '{call.group}'" if call.group else "all ranks"
                problems.append(
                    f"{paths[rank]} (rank {rank}), node {node.id} ({node.name!r}): collective "
                    f"#{seq + 1} in {where} is {collective_name(call.comm_type)} of {call.size} B, but "
                    f"rank {first.first_rank}'s (node {first.nodes[first.first_rank]}) is "
                    f"{collective_name(first.comm_type)} of {first.size} B")
    groups: dict[str, tuple[int, ...]] = {}
    for coll in matcher.open.values():
        groups.setdefault(coll.group, coll.members)
    for group in sorted(groups):
        members = groups[group]
        where = f"group '{group}'" if group else "all ranks"
        reference = members[0]
        expected = matcher.issued[reference].get(group, 0)
        for rank in members[1:]:
            if (rank, group) in stopped or (reference, group) in stopped:
                continue
            mine = matcher.issued[rank].get(group, 0)
            if mine == expected:
                continue
            more, fewer = (rank, reference) if mine > expected else (reference, rank)
            extra = matcher.open[(group, min(mine, expected))].nodes[more]
            by_group.setdefault(group, []).append(
                f"{paths.get(rank)} (rank {rank}): issues {mine} collective(s) in {where}, "
                f"rank {reference} issues {expected}; rank {more}'s node {extra} "
                f"({names[(more, extra)]!r}) would wait forever for rank {fewer}")
    return [problem for group in sorted(by_group) for problem in by_group[group]]
