"""Helpers shared by the hbm tests: a model on a bare EventQueue, hand-made memory nodes."""

from __future__ import annotations

from chakra_core import LayerContext, NodeView, pb
from chakra_core.testing import EventQueue
from chakra_sim_memory_hbm import HBMConfig, HBMMemory

MiB = 1 << 20


def mem_node(node_id: int, size: int | None, store: bool = False, location: str | None = None) -> NodeView:
    node = pb.Node(id=node_id, name=f"mem{node_id}", type=pb.MEM_STORE_NODE if store else pb.MEM_LOAD_NODE)
    if size is not None:
        node.attr.append(pb.AttributeProto(name="tensor_size", uint64_val=size))
    if location is not None:
        node.attr.append(pb.AttributeProto(name="mem_location", string_val=location))
    return NodeView(node)


def make(num_ranks: int = 4, **settings) -> tuple[HBMMemory, EventQueue]:
    queue = EventQueue()
    model = HBMMemory(HBMConfig.model_validate(settings), LayerContext(num_ranks=num_ranks, scheduler=queue))
    return model, queue


def run(model: HBMMemory, queue: EventQueue, accesses) -> dict[tuple[int, int], int]:
    """Issue (rank, node) pairs at t=0 in order; return {(rank, node id): completion time}."""
    finished: dict[tuple[int, int], int] = {}
    for rank, node in accesses:
        model.access(rank, node, lambda node_id, rank=rank: finished.setdefault((rank, node_id), queue.now))
    queue.run()
    return finished


REMOTE = {"remote-mem-latency": 100, "remote-mem-bw": 50}     # 50 B/ns
SIZE = 1 * MiB
REMOTE_NS = 100 + 20971                                          # 1 MiB / 50 B/ns = 20971.52 ns, truncated
