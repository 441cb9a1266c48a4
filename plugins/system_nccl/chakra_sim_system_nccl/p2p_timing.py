"""NCCL's point-to-point messages as PointToPoint sends them (`npus_count`, `send`): NCCL's
point-to-point cost, sharing NVLink or the NICs with what else is in flight, and across nodes
through the network layer when the run has one; and the check that operations folded together
crossed the network at the same instant."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

from chakra_core import LayerContext, Unfold
from chakra_sim_system_nccl.sharing import NIC, NVLINK

if TYPE_CHECKING:
    from chakra_sim_system_nccl.layer import NcclSystem


class P2PTiming:
    """What PointToPoint needs of a network (`npus_count`, `send`), timed by NCCL's point-to-point
    cost; across nodes through the network layer when the run has one."""

    def __init__(self, system: "NcclSystem"):
        self.system = system
        self.npus_count = system.context.num_ranks

    def send(self, src: int, dst: int, size: int, on_arrival: Callable[[Any], None], arg: Any = None) -> None:
        system = self.system
        same_node = system.same_node(src, dst)
        model = system.model
        latency = model.p2p_latency_us(same_node)
        transfer = model.p2p_transfer_us(size, same_node)
        scheduler = system.context.scheduler
        now = scheduler.now
        traffic = system.internode
        if traffic is not None and not same_node:
            pairs: Sequence[tuple[int, int]] = [(src, dst)]
            if system.folding is not None:   # every pair this message stands for
                pairs = system.folding.pairs(src, dst)
            alone = now + ns(latency + transfer)
            traffic.run([[(a, b, size)] for a, b in pairs],
                        lambda finishes: self._crossed(pairs, now, alone, ns(latency), finishes, on_arrival, arg))
            return
        # both ends' fabric (by their representatives in folded runs: src is one)
        ends = (src, system.representative[dst])
        fabric = NVLINK if same_node else NIC
        sharing = 1 + system.load.others(fabric, ends, now)
        delay = ns(latency + transfer * sharing)
        system.load.add(fabric, ends, now, now + delay)
        scheduler.schedule(delay, on_arrival, arg)

    def _crossed(self, pairs: Sequence[tuple[int, int]], start: int, alone: int, latency_ns: int, finishes: list[int],
                 on_arrival: Callable[[Any], None], arg: Any) -> None:
        """The message (and those it stands for) crossed the network: it arrives when NCCL's time
        alone says, or one step's latency after its last byte, whichever is later."""
        context = self.system.context
        if not apart(context, lambda i: f"the message {pairs[i][0]} -> {pairs[i][1]}", start, finishes):
            context.scheduler.schedule_at(max(alone, finishes[0] + latency_ns), on_arrival, arg)


def apart(context: LayerContext, what: Callable[[int], str], start: int, finishes: list[int]) -> bool:
    """Whether operations folded together (the i-th named `what(i)`) got through the network at
    different instants; if so the run starts over unfolded, saying which two and when."""
    if len(set(finishes)) == 1:
        return False
    # the one farthest from the first (the slowest named itself when the first was the slowest)
    slow = max(range(len(finishes)), key=lambda i: abs(finishes[i] - finishes[0]))
    reason = (f"{what(slow)} takes {finishes[slow] - start:,} ns on the network and {what(0)}, which it is "
              f"folded with, {finishes[0] - start:,} ns (their flows cross the network differently: hash ECMP "
              "collisions, a failed or degraded link; ecmp: dmodk routes equivalent ranks alike); simulating "
              "every rank")
    context.request_restart(reason, Unfold(reason))
    return True



def ns(time_us: float) -> int:
    return int(round(time_us * 1000))
