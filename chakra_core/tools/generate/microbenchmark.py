"""Collective and point-to-point microbenchmark traces (`chakra-sim generate microbenchmark`).

ASTRA-sim's collective microbenchmarks: one COMM_COLL node per rank and iteration; for one
iteration the files are byte for byte ASTRA-sim's `examples/workload/microbenchmarks`. Point-to-point
patterns (`send_recv`) are rounds of COMM_SEND/COMM_RECV nodes.
"""

from __future__ import annotations

import os
from pathlib import Path

from chakra_core.schema import pb
from chakra_core.et.build import (Stream, read_collective, int_attr, metadata, p2p_attrs,
                                      write_rank_files)
from chakra_core.limits import GENERATED_NODES, check_rank_count
from chakra_core.tools.generate.errors import GeneratorError


COLLECTIVES = {
    "all_reduce": pb.ALL_REDUCE,
    "all_gather": pb.ALL_GATHER,
    "reduce_scatter": pb.REDUCE_SCATTER,
    "all_to_all": pb.ALL_TO_ALL,
    "broadcast": pb.BROADCAST,
    "reduce": pb.REDUCE,
    "gather": pb.GATHER,
    "scatter": pb.SCATTER,
    "barrier": pb.BARRIER,
}
ROOTED = ("broadcast", "reduce", "gather", "scatter")
P2P_PATTERNS = ("ring", "pairwise", "all-pairs")


def size_label(size: int) -> str:
    """ASTRA-sim's naming: 1048576 -> '1MB', 65536 -> '64KB', 100 -> '100B'."""
    if size and size % (1 << 20) == 0:
        return f"{size >> 20}MB"
    if size and size % (1 << 10) == 0:
        return f"{size >> 10}KB"
    return f"{size}B"


def p2p_rounds(pattern: str, npus: int, shift: int = 1) -> list[list[tuple[int, int]]]:
    """Per round, the (src, dst) messages of a point-to-point pattern.

    ring: every rank sends to rank + shift (mod N) and receives from rank - shift, one round;
    pairwise: ranks 2i and 2i+1 exchange, one round (N even);
    all-pairs: N-1 rounds, in round k every rank sends to rank + k and receives from rank - k
    (the pairwise-exchange all-to-all).
    """
    if pattern == "ring":
        return [[(r, (r + shift) % npus) for r in range(npus)]]
    if pattern == "pairwise":
        return [[(r, r ^ 1) for r in range(npus)]]
    if pattern == "all-pairs":
        return [[(r, (r + k) % npus) for r in range(npus)] for k in range(1, npus)]
    raise GeneratorError(f"unknown pattern {pattern!r}; expected one of {', '.join(P2P_PATTERNS)}")


def microbenchmark_traces(collective: str, size: int | None, npus: int, iterations: int = 1,
                          root: int = 0, pattern: str = "ring", shift: int = 1) -> list[list[pb.Node]]:
    """One node list per rank. Iteration i waits for iteration i-1 on the same rank."""
    if npus < 1:
        raise GeneratorError("--npus must be at least 1")
    if iterations < 1:
        raise GeneratorError("--iterations must be at least 1")
    if size is not None and size > (1 << 63) - 1:
        raise GeneratorError(f"--size {size}: more than the 2^63-1 bytes a Chakra trace's comm_size "
                             "(a 64-bit integer) holds")
    if collective == "send_recv":
        messages = npus * (npus - 1) if pattern == "all-pairs" else npus   # p2p_rounds' count, not its lists
        _check_nodes(2 * messages * iterations, npus, iterations)          # a send and a receive each
        return _send_recv_traces(size, npus, iterations, pattern, shift)
    _check_nodes(npus * iterations, npus, iterations)
    if collective not in COLLECTIVES:
        raise GeneratorError(f"unknown collective {collective!r}; expected one of "
                             f"{', '.join([*COLLECTIVES, 'send_recv'])}")
    if collective == "barrier":
        if size:
            raise GeneratorError(f"a barrier moves no data: drop --size {size} (its comm_size is 0)")
        size = 0
    elif size is None:
        raise GeneratorError(f"{collective} needs --size BYTES")
    if size < 0:
        raise GeneratorError("--size must be >= 0")
    if collective in ROOTED and not 0 <= root < npus:
        raise GeneratorError(f"--root {root} is not a rank (0..{npus - 1})")
    base = f"{collective}_{npus}npus_{size_label(size)}"
    ranks = []
    for rank in range(npus):
        nodes = []
        for i in range(iterations):
            node = pb.Node(id=i * npus + rank, name=base if iterations == 1 else f"{base}.{i}",
                           type=pb.COMM_COLL_NODE)
            if i:
                node.data_deps.append((i - 1) * npus + rank)
            node.attr.extend(read_collective(COLLECTIVES[collective], size))
            if collective in ROOTED:
                node.attr.append(int_attr("root_rank", root))
            nodes.append(node)
        ranks.append(nodes)
    return ranks


def _check_nodes(nodes: int, npus: int, iterations: int) -> None:
    """Every rank's nodes are built before the first is written: refuse what would not fit."""
    if nodes > GENERATED_NODES.value():
        raise GeneratorError(f"--npus {npus} x --iterations {iterations}: {nodes:,} nodes to build in memory; "
                             f"{GENERATED_NODES.hint()}")


def _send_recv_traces(size: int | None, npus: int, iterations: int, pattern: str,
                      shift: int) -> list[list[pb.Node]]:
    if size is None or size < 0:
        raise GeneratorError("send_recv needs --size BYTES (>= 0)")
    if npus < 2:
        raise GeneratorError("send_recv needs at least 2 NPUs")
    if pattern == "pairwise" and npus % 2:
        raise GeneratorError(f"the pairwise pattern pairs ranks 2i and 2i+1: it needs an even number of "
                             f"NPUs, not {npus}")
    if pattern == "ring" and shift % npus == 0:
        raise GeneratorError(f"--shift {shift} sends every rank to itself on {npus} NPUs")
    rounds = p2p_rounds(pattern, npus, shift)
    ranks = []
    for rank in range(npus):
        stream = Stream()
        for i in range(iterations):
            for k, messages in enumerate(rounds):
                tag = i * len(rounds) + k
                posted = []
                for src, dst in messages:
                    if src == rank:
                        posted.append(stream.launch(
                            pb.COMM_SEND_NODE, f"send.{i}.{k}.to{dst}",
                            attrs=p2p_attrs(src, dst, tag, size)))
                for src, dst in messages:
                    if dst == rank:
                        posted.append(stream.launch(
                            pb.COMM_RECV_NODE, f"recv.{i}.{k}.from{src}",
                            attrs=p2p_attrs(src, dst, tag, size)))
                stream.frontier = posted
        ranks.append(stream.nodes)
    return ranks


def write_microbenchmark(prefix: str | os.PathLike[str], collective: str, size: int | None, npus: int,
                         iterations: int = 1, root: int = 0, pattern: str = "ring", shift: int = 1,
                         compress: bool = False) -> list[Path]:
    check_rank_count(npus, "--npus")   # before the ranks' nodes are built
    ranks = microbenchmark_traces(collective, size, npus, iterations, root, pattern, shift)
    # version only, like ASTRA-sim's microbenchmark files (so one iteration is byte-identical)
    return write_rank_files(prefix, ranks, metadata({}), compress=compress, count=npus, what="--npus")
