"""Symmetry folding: find the classes of equivalent ranks, to simulate one rank per class and give
every rank its class's results (the classes themselves: chakra_core.contract.folding).

Most training jobs are SPMD: data-parallel replicas and tensor-parallel peers run the same
program. Two ranks are equivalent when their traces are identical once every rank id in them
is written relative to the rank itself, and when the ranks they talk to are equivalent in
the same way. Then, on a network where their positions are equivalent too, they behave
identically and one of them (the representative, the smallest rank of the class) stands for
all.

Finding the classes (`find_folding`) reads every trace once:

1. A signature per rank: its nodes, with each rank id it names replaced by that id relative
   to the rank (and the names of communication nodes, which often spell out rank ids, left
   out): a point-to-point peer by its offset (`peer - rank`, modulo the number of ranks: a
   ring of sends looks the same from every rank), a communicator group
   by its shape (n ranks `stride` apart, the rank's position in it left out: a ring does not
   care where it starts; any other group by the offsets of its members), a collective's root
   by its position relative to the rank's. Nodes that name no rank are hashed as they are.
2. Ranks with equal signatures are candidates; the candidate classes are then refined until
   every member of a class sees the same classes at the same offsets and group positions
   (partition refinement): what one member's peers do, the others' peers do too.

What the traces cannot show (that the network treats equivalent ranks alike, that a layer's
answer does not depend on the rank) is checked while simulating: each collective must finish
at the same time on every member of a class, each point-to-point message must take the same
time for every pair it stands for, and every layer must declare `fold_safe`. The first check
that fails makes the run start over with every rank simulated.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Sequence

from chakra_core.comm.collectives import ROOT_ATTRS
from chakra_core.comm.groups import group_shape, parse_pg_list
from chakra_core.contract.folding import Folding
from chakra_core.cores import usable_cores
from chakra_core.errors import TraceFormatError
from chakra_core.et.io import decode_varint, parse_metadata, parse_node, read_file_bytes
from chakra_core.schema import pb

if TYPE_CHECKING:
    from chakra_core.config.spec import RunSpec

PEER_ATTRS = ("comm_src", "comm_dst")
_MARKER_RE = re.compile(rb"comm_src|comm_dst|pg_|root")
"""Byte strings found in every node that can name a rank; other nodes are hashed unparsed."""


@dataclass
class _RankView:
    """What one rank's trace says about the ranks it talks to."""

    digest: bytes
    offsets: tuple[int, ...]                      # point-to-point peers, relative to the rank
    groups: tuple[tuple[int, ...], ...]           # members of each group it uses, in ring order
    foldable: bool = True


def _relative_ring(members: tuple[int, ...], rank: int) -> tuple[int, ...]:
    """The members in ring order starting at `rank`."""
    position = members.index(rank)
    return members[position:] + members[:position]


@dataclass
class _Seen:
    """What `_canonical` notes while it reads a rank's nodes."""

    offsets: set[int] = field(default_factory=set)
    groups: set[tuple[int, ...]] = field(default_factory=set)
    foldable: bool = True


def _canonical(node: pb.Node, rank: int, ranks: int, groups: dict[str, tuple[int, ...]], view: _Seen) -> bytes:
    """The node with the rank ids it names written relative to `rank`."""
    copy = pb.Node()
    copy.CopyFrom(node)
    copy.name = ""        # names of communication nodes often spell out their peers; timing ignores them
    text = copy.inputs.values
    if copy.type == pb.METADATA_NODE and "pg_name" in text:
        shapes = []
        for entry in parse_pg_list(text) or []:
            defined = tuple(sorted(entry.ranks))
            groups[entry.name] = defined
            if rank in defined:
                shapes.append(repr(group_shape(defined, rank)))
        copy.inputs.values = ";".join(sorted(shapes))
    members: tuple[int, ...] | None = None
    for attr in copy.attr:
        if attr.name == "pg_name":
            name = attr.string_val if attr.WhichOneof("value") == "string_val" else str(attr)
            if name in ("", "0") and name not in groups:
                continue
            members = groups.get(name)
            if members is None or rank not in members:
                view.foldable = False
                continue
            view.groups.add(members)
            attr.string_val = repr(group_shape(members, rank))
    for attr in copy.attr:
        which = attr.WhichOneof("value")
        if attr.name in PEER_ATTRS and which and which.endswith("_val") and which != "string_val":
            offset = (int(getattr(attr, which)) - rank) % ranks   # ranks are a ring: wrap around
            view.offsets.add(offset)
            attr.ClearField(which)
            attr.int64_val = offset
        elif attr.name in ROOT_ATTRS and which and which.endswith("_val") and which != "string_val":
            root = int(getattr(attr, which))
            ring = members if members is not None else None
            attr.ClearField(which)
            if ring is not None and root in ring:
                attr.int64_val = (ring.index(root) - ring.index(rank)) % len(ring)
            else:
                attr.int64_val = root - rank
    return copy.SerializeToString(deterministic=True)


def rank_view(path: str, rank: int, ranks: int, comm_groups: Mapping[str, Sequence[int]]) -> _RankView:
    """Read one rank's trace into its signature (see module docstring)."""
    data = read_file_bytes(path)
    groups = {name: tuple(sorted(members)) for name, members in comm_groups.items()}
    view = _Seen()
    digest = hashlib.blake2b()
    # Where a rank id may be named; frames without one are hashed as they are, in stretches.
    marks = [m.start() for m in _MARKER_RE.finditer(data)]
    next_mark = marks[0] if marks else len(data)
    mark_index = 0
    end = len(data)
    pos = 0
    stretch = None           # start of the bytes not hashed yet (after the metadata frame)
    while pos < end:
        byte = data[pos]
        if byte < 0x80:
            length, start = byte, pos + 1
        elif pos + 1 < end and data[pos + 1] < 0x80:
            length, start = (byte & 0x7F) | (data[pos + 1] << 7), pos + 2
        else:
            length, start = decode_varint(data, pos, path)
        stop = start + length
        if stop > end:
            raise TraceFormatError(path, pos, "message runs past the end of the file (truncated file)")
        if stretch is None:
            parse_metadata(data[start:stop], path, pos)
            stretch = stop
        elif next_mark < stop:
            digest.update(data[stretch:pos])
            digest.update(b"\x00" + _canonical(parse_node(data[start:stop], path, pos), rank, ranks, groups, view))
            stretch = stop
            while mark_index < len(marks) and marks[mark_index] < stop:
                mark_index += 1
            next_mark = marks[mark_index] if mark_index < len(marks) else end
        pos = stop
    if stretch is not None:
        digest.update(data[stretch:])
    # Groups in the order of their shapes, which equivalent ranks share (their members differ).
    used = sorted(view.groups, key=lambda members: repr(group_shape(members, rank)))
    return _RankView(digest.digest(), tuple(sorted(view.offsets)), tuple(used), view.foldable)


def _views(paths: list[str], comm_groups: Mapping[str, Sequence[int]], workers: int) -> list[_RankView]:
    if workers <= 1 or len(paths) < 64:
        return [rank_view(p, r, len(paths), comm_groups) for r, p in enumerate(paths)]
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(workers) as pool:
        return list(pool.map(rank_view, paths, range(len(paths)), [len(paths)] * len(paths),
                             [comm_groups] * len(paths),
                             chunksize=max(1, len(paths) // (8 * workers))))


def find_folding(paths: Sequence[str | os.PathLike[str]], comm_groups: Mapping[str, Sequence[int]] | None = None,
                 workers: int | None = None) -> tuple[Folding | None, str]:
    """The classes of equivalent ranks, or None and why not."""
    files = [str(p) for p in paths]
    ranks = len(files)
    if ranks < 2:
        return None, "one rank"
    views = _views(files, comm_groups or {}, workers if workers is not None else usable_cores())
    # Initial classes: equal signatures (unfoldable ranks each alone).
    keys: dict[object, int] = {}
    label: list[int] = []
    for rank, view in enumerate(views):
        key = view.digest if view.foldable else ("alone", rank)
        label.append(keys.setdefault(key, len(keys)))
    # Refine until every member of a class sees the same classes around it.
    while True:
        keys = {}
        refined = []
        for rank, view in enumerate(views):
            around: list[object] = []
            for offset in view.offsets:
                around.append(label[(rank + offset) % ranks])
            for members in view.groups:
                around.append(tuple(label[m] if 0 <= m < ranks else -1
                                    for m in _relative_ring(members, rank)))
            refined.append(keys.setdefault((label[rank], tuple(around)), len(keys)))
        if len(keys) == len(set(label)):
            break
        label = refined
    classes = len(set(label))
    if classes == ranks:
        return None, "no two ranks are equivalent"
    first: dict[int, int] = {}
    representative = [first.setdefault(label[rank], rank) for rank in range(ranks)]
    interned: dict[tuple[int, ...], tuple[int, ...]] = {}
    groups_of = [tuple(interned.setdefault(g, g) for g in view.groups) for view in views]
    return Folding.of(representative, groups_of), ""


def unfolded_job(spec: RunSpec, reason: str, time_note: str) -> tuple[RunSpec, str]:
    """A job folded by construction (its traces are its representatives') whose run cannot fold
    after all (`reason`: a network treats class mates apart, a layer is not fold-safe): the run
    with every rank's traces of the whole step, written now (`spec.unfolded_traces`), folded
    neither in space nor in time; and what to say of time folding (`time_note` unless it folded)."""
    assert spec.unfolded_traces is not None
    if spec.time_folding is not None:
        time_note = f"time folding: {reason.removesuffix('; simulating every rank')}; simulating every rank and " \
                    "every micro-batch"
    return dataclasses.replace(spec, trace_files=spec.unfolded_traces(), folding=None, time_folding=None,
                               unfolded_traces=None), time_note
