"""Collective types, and how a collective node is read: type, size, group, root.

A COMM_COLL node carries `comm_type` (a `CollectiveCommType`), `comm_size` (bytes;
see docs/collectives.md for what it counts per type), an optional `pg_name`
(the communicator group; none, "" or "0" is all ranks) and, for rooted
collectives, the root's rank (`root_rank`, `root` or `comm_root`). A barrier
moves no data and runs as a 0-byte all-reduce. An all-to-all whose pieces differ (PyTorch's
`all_to_all_single` with split sizes, a mixture of experts' token dispatch) carries the bytes this
rank sends to and receives from each member, in the group's member order: `comm_send_splits` and
`comm_recv_splits` (uint64 lists; comm_size stays the whole send buffer, their sum). Its members'
comm_size then differ, and what member i sends member j must be what j receives from i.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from chakra_core.errors import SimulationError
from chakra_core.et.attrs import NodeView
from chakra_core.schema import pb

ALL_REDUCE = pb.ALL_REDUCE
ALL_GATHER = pb.ALL_GATHER
REDUCE_SCATTER = pb.REDUCE_SCATTER
ALL_TO_ALL = pb.ALL_TO_ALL
ROOTED = frozenset({pb.BROADCAST, pb.REDUCE, pb.GATHER, pb.SCATTER})
"""Collectives with a root: its part differs from the others'."""
SYMMETRIC = frozenset({ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL})
"""Collectives where every member does the same."""
COLLECTIVE_TYPES = SYMMETRIC | ROOTED | {pb.REDUCE_SCATTER_BLOCK, pb.BARRIER}
"""Collective types a system layer runs (a barrier as a 0-byte all-reduce)."""
ROOT_ATTRS = ("root_rank", "root", "comm_root")
"""Attributes naming a rooted collective's root, in the order they are looked for."""
SEND_SPLITS, RECV_SPLITS = "comm_send_splits", "comm_recv_splits"
"""An uneven all-to-all's bytes to and from each member (module docstring)."""
Splits = tuple[tuple[int, ...], tuple[int, ...]]
"""(bytes sent to, bytes received from) each member of an uneven all-to-all, in member order."""


def collective_name(comm_type: int) -> str:
    """The schema's name of a collective type ("ALL_REDUCE"), or UNKNOWN(<n>)."""
    try:
        return pb.CollectiveCommType.Name(comm_type)
    except ValueError:
        return f"UNKNOWN({comm_type})"


class CollectiveCall(NamedTuple):
    """A collective node as a system layer reads it."""

    comm_type: int
    size: int
    """comm_size in bytes (0 for a barrier)."""
    group: str
    """The communicator group's name; "" is all ranks."""
    splits: Splits | None = None
    """An uneven all-to-all's pieces (comm_send_splits, comm_recv_splits); None: even."""


def read_collective(rank: int, node: NodeView, warn: Callable[[str], None]) -> CollectiveCall:
    """(comm_type, comm_size, group) of a collective node, checked ("" is all ranks)."""
    comm_type = node.int("comm_type")
    size = node.int("comm_size", 0)
    if comm_type not in COLLECTIVE_TYPES:
        raise SimulationError(f"rank {rank}, node {node.id} ({node.name!r}): unknown collective "
                              f"type {comm_type}")
    if size < 0:
        raise SimulationError(f"rank {rank}, node {node.id}: negative comm_size {size}")
    if comm_type == pb.BARRIER and size:
        # A barrier synchronises and moves no data: it runs as a 0-byte all-reduce.
        warn(f"BARRIER nodes carry comm_size (e.g. rank {rank}, node {node.id}: {size} B); "
             "a barrier moves no data, so the size is ignored")
        size = 0
    group = node.str("pg_name", "")
    splits = read_splits(rank, node, size) if comm_type == ALL_TO_ALL else None
    return CollectiveCall(comm_type, size, "" if group == "0" else group, splits)


def read_splits(rank: int, node: NodeView, size: int) -> Splits | None:
    """An all-to-all's comm_send_splits and comm_recv_splits, checked; None when it has neither."""
    lists = [node.raw(SEND_SPLITS), node.raw(RECV_SPLITS)]
    if lists == [None, None]:
        return None
    where = f"rank {rank}, node {node.id} ({node.name!r})"
    for name, value in zip((SEND_SPLITS, RECV_SPLITS), lists):
        if value is None:
            raise SimulationError(f"{where}: an uneven all-to-all needs both {SEND_SPLITS} and {RECV_SPLITS} "
                                  f"(the bytes to and from each member); {name} is missing")
        if not isinstance(value, list) or not all(isinstance(v, int) and v >= 0 for v in value):
            raise SimulationError(f"{where}: {name} must be a list of non-negative byte counts, not {value!r}")
    send, recv = tuple(lists[0]), tuple(lists[1])
    if sum(send) != size:
        raise SimulationError(f"{where}: comm_size {size:,} B is not the sum of {SEND_SPLITS} "
                              f"({sum(send):,} B): an all-to-all's comm_size is its whole send buffer")
    return send, recv


def even_pieces(splits: Splits | None) -> bool:
    """Pieces that all-to-all's even split already gives: one size to and from every member."""
    return splits is None or len(set(splits[0]) | set(splits[1])) <= 1


def collective_root(node: NodeView, members: tuple[int, ...], rank: int, comm_type: int) -> int:
    """The root of a rooted collective (its root attribute, else the group's first rank); the
    first rank for the others."""
    if comm_type not in ROOTED:
        return members[0]
    for attr in ROOT_ATTRS:
        if node.has(attr):
            root = node.int(attr)
            if root not in members:
                raise SimulationError(f"rank {rank}, node {node.id}: root {root} ({attr}) is not "
                                      f"a member of the collective's group {list(members)}")
            return root
    return members[0]


def collective_wait(node_id: int, what: str, missing: list[int]) -> str:
    """A deadlock report's line for an open collective: the ranks that never issued it, if any."""
    if not missing:
        return f"collective node {node_id}: {what} is in progress"
    shown = ", ".join(map(str, missing[:16])) + (" ..." if len(missing) > 16 else "")
    return f"collective node {node_id}: {what} waits for rank(s) {shown}, which never issued it"


def describe(comm_type: int, size: int, group: str, seq: int) -> str:
    """"ALL_REDUCE of 1024 B among group 'tp' (#3 there)"."""
    where = f"group '{group}'" if group else "all ranks"
    return f"{collective_name(comm_type)} of {size} B among {where} (#{seq + 1} there)"
