"""An all-to-all whose pieces differ (`comm_send_splits` / `comm_recv_splits`: PyTorch's
all_to_all_single with split sizes, a mixture of experts' token dispatch).

PyTorch runs it as one ncclSend and one ncclRecv of each peer's count inside ncclGroupStart /
ncclGroupEnd (torch/csrc/cuda/nccl.cpp all2all_single_unequal_split, which ProcessGroupNCCL's
alltoall_base calls with split sizes; NCCL's own ncclAlltoAll takes one count for every peer), so
each member exchanges its own pieces: with the members of its node over NVLink and with the
others over its NICs, at once. It takes the slower of its sending and its receiving on each side
(`NcclModel.fan_time_us`, the even all-to-all's rule with that member's byte counts), and every
member ends with the slowest member: the others wait to receive its pieces or to have theirs
received. Each member counts what it sends and receives, less the piece it keeps.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

from chakra_sim_system_nccl import model as nccl
from chakra_sim_system_nccl.traffic import Splits


def uneven_all_to_all(model: nccl.NcclModel, same_node: Callable[[int, int], bool], members: Sequence[int],
                      splits: Mapping[int, Splits], nbytes: int) -> tuple[nccl.Choice, str, int, int] | None:
    """The slowest member's exchange, as (choice, collective, bytes NCCL counts, bytes moved);
    None when nothing crosses between members."""
    slowest: nccl.Choice | None = None
    for rank in members:
        send, recv = splits[rank]
        sums = [0, 0, 0, 0]   # sent and received on its node, sent and received across nodes
        remote_peers = 0
        for index, member in enumerate(members):
            if member == rank:
                continue
            across = 0 if same_node(rank, member) else 2
            sums[across] += send[index]
            sums[across + 1] += recv[index]
            remote_peers += 1 if across and (send[index] or recv[index]) else 0
        local, remote = max(sums[0], sums[1]), max(sums[2], sums[3])
        if local or remote:
            choice = model.fan_time_us(local, remote, max(remote_peers, 1))
            if slowest is None or choice.time_us > slowest.time_us:
                slowest = choice
    return None if slowest is None else (slowest, nccl.ALL_TO_ALL, nbytes, nbytes)


def moved_pieces(members: Sequence[int], splits: Mapping[int, Splits], rank: int) -> tuple[int, int]:
    """Bytes `rank` sends and receives in an uneven all-to-all, less the piece it keeps."""
    own, (send, recv) = members.index(rank), splits[rank]
    return sum(send) - send[own], sum(recv) - recv[own]
