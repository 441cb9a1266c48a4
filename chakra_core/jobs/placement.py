"""Ranks on machines, in Megatron's order, and the communicator groups each rank belongs to.

Megatron numbers ranks with tensor parallelism fastest, then context, data and pipeline
parallelism (megatron/core/parallel_state.py, order "tp-cp-ep-dp-pp"), and launchers fill a
node's GPUs with consecutive ranks; so TP and CP groups stay inside a node when tp x cp fits
in it, while data and pipeline parallel peers sit on other nodes.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from functools import cached_property

from chakra_core.jobs.flex_dispatcher import NVL_PEERS
from chakra_core.jobs.hybrid_ep import hybridep_domain, uses_hybridep
from chakra_core.jobs.optimizer_offload import HostOptimizer
from chakra_core.jobs.spec import JobSpec
from chakra_core.jobs.step import PlacedGroup


@dataclass(frozen=True)
class Coord:
    tp: int
    cp: int
    dp: int
    pp: int


class Placement:
    """Where rank r sits (`coord`, `node`), on what GPU, and the groups it uses (`groups`)."""

    def __init__(self, job: JobSpec, gpus_per_node: int, architecture: str = "hopper",
                 host_optimizer: HostOptimizer | None = None):
        self.job = job
        self.architecture = architecture
        """The GPUs' generation (the profile's gpu.architecture): Transformer Engine's fp8 copies
        depend on it (jobs/fp8.py fp8_transposes)."""
        self.host_optimizer = host_optimizer
        """The hosts' CPU Adam (the profile's node section), for optimizer offload (jobs/optimizer_offload.py)."""
        p = job.parallel
        self.tp, self.cp, self.dp, self.pp = p.tp, p.cp, job.dp, p.pp
        self.world = job.cluster.gpus
        self.gpus_per_node = gpus_per_node
        self.moe = job.shape.moe
        self.ep, self.etp = p.ep, p.expert_tp
        self._interned: dict[tuple[str, int], tuple[int, ...]] = {}

    @property
    def flex_domain(self) -> int:
        """Ranks per NVLink domain of the flex dispatcher's backend: DeepEP's 8, HybridEP's the job's domain."""
        if uses_hybridep(self.job.parallel):
            return hybridep_domain(self.ep, self.gpus_per_node)
        return NVL_PEERS

    def _group(self, role: str, start: int, stop: int, step: int = 1) -> tuple[int, ...]:
        """The group `range(start, stop, step)`, one tuple object per group: the ranks of a group
        share it (a folded run's layers cache by identity; a job of 131,072 ranks holds each group
        once instead of once per member)."""
        key = (role, start)
        group = self._interned.get(key)
        if group is None:
            group = self._interned[key] = tuple(range(start, stop, step))
        return group

    def rank(self, c: Coord) -> int:
        return c.tp + self.tp * (c.cp + self.cp * (c.dp + self.dp * c.pp))

    def coord(self, rank: int) -> Coord:
        tp_i, rest = rank % self.tp, rank // self.tp
        cp_i, rest = rest % self.cp, rest // self.cp
        dp_i, pp_i = rest % self.dp, rest // self.dp
        return Coord(tp_i, cp_i, dp_i, pp_i)

    def node(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def groups(self, rank: int) -> dict[str, tuple[int, ...]]:
        """The rank's communicators of more than one rank, by role, in a fixed order (folding
        pairs equivalent ranks' groups by this order):
        tp, cp (and a2a+p2p's cp_a2a and cp_p2p), dp_cp (gradients and the distributed optimizer: data x
        context parallel ranks; with hybrid sharding one replica's block, and dp_outer across them),
        emb (first and last stage: tied or MTP embedding gradients), amax (fp8 scaling: tp x cp x dp);
        a mixture of experts adds etp, ep and edp (`expert_groups`), and stage (tp x cp x dp) with
        the router's expert bias.
        Members are arithmetic runs of the rank order (a job of 16,384 ranks asks for all of them)."""
        c = self.coord(rank)
        tp, stage = self.tp, self.tp * self.cp * self.dp      # ranks per pipeline stage
        out: dict[str, tuple[int, ...]] = {}
        if tp > 1:
            out["tp"] = self._group("tp", rank - c.tp, rank - c.tp + tp)
        if self.cp > 1:
            start = rank - tp * c.cp
            out["cp"] = self._cp_group(rank)
            sizes = self.job.parallel.hierarchical_context_parallel_sizes
            if sizes is not None:   # a2a+p2p: runs of a2a CP ranks, and the ranks of one a2a index
                a2a = sizes[0]
                first = start + tp * a2a * (c.cp // a2a)
                out["cp_a2a"] = self._group("cp_a2a", first, first + tp * a2a, tp)
                out["cp_p2p"] = self._group("cp_p2p", start + tp * (c.cp % a2a), start + tp * self.cp, tp * a2a)
        if self.dp * self.cp > 1:
            start = c.tp + stage * c.pp
            replicas = self.job.training.num_distributed_optimizer_instances
            if replicas == 1:
                out["dp_cp"] = self._group("dp_cp", start, start + stage, tp)
            else:   # HSDP: consecutive blocks of the dp x cp ranks shard, ranks at one place across them replicate
                block = self.dp * self.cp // replicas
                place = (rank - start) // tp
                first = start + tp * block * (place // block)
                out["dp_cp"] = self._group("dp_cp", first, first + tp * block, tp)
                out["dp_outer"] = self._group("dp_outer", start + tp * (place % block), start + stage, tp * block)
        # the word embedding's gradient is all-reduced between the first and the last stage when the
        # last one holds it too: tied to the output layer, or for the MTP layers (finalize_model_grads.py
        # _get_shared_word_embedding_weight at d98e8a64)
        shared = self.job.shape.tied_embeddings or self.job.shape.mtp_layers > 0
        if self.pp > 1 and shared and c.pp in (0, self.pp - 1):
            first = rank - stage * c.pp
            out["emb"] = self._group("emb", first, first + stage * (self.pp - 1) + 1, stage * (self.pp - 1))
        if self.job.training.precision == "fp8" and stage > 1:
            out["amax"] = self._group("amax", stage * c.pp, stage * (c.pp + 1))
        if self.moe:
            out.update(self.expert_groups(rank))
            if self.job.shape.router_expert_bias and stage > 1:
                # the routers' token counts, all-reduced over the stage's TP x CP x DP ranks before the
                # expert bias is updated (finalize_model_grads._update_router_expert_bias at d98e8a64)
                out["stage"] = self._group("stage", stage * c.pp, stage * (c.pp + 1))
        return out

    def expert_groups(self, rank: int) -> dict[str, tuple[int, ...]]:
        """MoE parallel folding: Megatron-Core's expert RankGenerator lays etp, ep and expert-data
        parallel ranks over each pipeline stage's tp x cp x dp ranks in the order tp-ep-dp with etp
        as the tensor size (megatron/core/parallel_state.py initialize_model_parallel at d98e8a64:
        expert_decoder_rank_generator, cp=1, pp last as in the dense order), independently of how
        attention splits them. etp: an expert's tensor-parallel shards (the dispatcher's all-gather
        and reduce-scatter); ep: ranks holding different experts (the token all-to-alls); edp: ranks
        holding the same expert shard (its gradients' reduction, its optimizer shards); tp_ep: the etp x ep
        ranks of the allgather dispatcher (and of the alltoall dispatcher's token counts)."""
        stage = self.tp * self.cp * self.dp
        base = stage * (rank // stage)
        i = rank - base
        etp, ep = self.etp, self.ep
        out: dict[str, tuple[int, ...]] = {}
        if etp > 1:
            start = base + i - i % etp
            out["etp"] = self._group("etp", start, start + etp)
        if ep > 1:
            start = base + i % etp + etp * ep * (i // (etp * ep))
            out["ep"] = self._group("ep", start, start + etp * ep, etp)
            domain = self.flex_domain
            if self.job.parallel.moe_token_dispatcher == "flex" and ep > domain:   # etp 1 (flex_problems)
                j = i % ep   # DeepEP's rdma_rank j // 8 and nvl_rank j % 8 (flex_dispatcher); HybridEP's alike
                out["ep_rdma"] = self._group("ep_rdma", start + j % domain, start + ep, domain)
                out["ep_nvl"] = self._group("ep_nvl", start + j - j % domain, start + j - j % domain + domain)
        dispatcher = self.job.parallel.moe_token_dispatcher   # alltoall gathers its counts over it (ep alone: etp 1)
        if etp * ep > 1 and (dispatcher == "allgather" or dispatcher == "alltoall" and etp > 1):   # 'tp-ep'
            start = base + i - i % (etp * ep)
            out["tp_ep"] = self._group("tp_ep", start, start + etp * ep)
        if stage // (etp * ep) > 1:
            start = base + i % (etp * ep)
            out["edp"] = self._group("edp", start, base + stage, etp * ep)
        return out

    @staticmethod
    def group_name(role: str, members: tuple[int, ...]) -> str:
        return f"{role}{members[0]}"

    def peer(self, rank: int, stage_step: int) -> int:
        """The rank `stage_step` pipeline stages away (wrapping, as interleaved chunks do)."""
        c = self.coord(rank)
        return self.rank(Coord(c.tp, c.cp, c.dp, (c.pp + stage_step) % self.pp))

    # Folding ------------------------------------------------------------------------------------
    @cached_property
    def _cp_classes(self) -> int:
        """How many CP indices stand apart: CP rank c stands for those whose index is c modulo it.

        Ring attention's exchanges go to the next rank of the CP group, the last wrapping to the
        first. CP ranks run the same program (jobs/context_parallel.py writes rank 0's shapes), so
        two of them behave alike when the ring, turned from one to the other, crosses between
        nodes at the same places: with every exchange within a node, or every one across, one
        rank stands for all (1); with four CP ranks on two nodes (within, across, within, across)
        ranks 0 and 2 stand for each other (2). Every ring must cross at the same places, else
        (and with a2a+p2p, whose rings run over every a2a-th CP rank) each index stands apart. A
        folded run matches the exchanges by ring position (`cp_rings`)."""
        kind = self.job.parallel.cp_comm_type
        if self.cp == 1 or kind not in ("p2p", "a2a+p2p"):
            return 1
        if kind == "a2a+p2p":
            return self.cp
        stride = self.tp * self.cp   # a CP group starts at each tp index of each block of tp x cp ranks
        # nodes are consecutive ranks: the blocks' crossings repeat every lcm(stride, node) ranks
        blocks = range(0, min(self.world, math.lcm(stride, self.gpus_per_node)), stride)
        rings = {self._cp_group(start) for block in blocks for start in range(block, block + self.tp)}
        crossings = {tuple(self.node(a) == self.node(b) for a, b in zip(ring, ring[1:] + ring[:1])) for ring in rings}
        if len(crossings) > 1:
            return self.cp
        crossing = crossings.pop()
        return next(turn for turn in range(1, self.cp + 1) if crossing == crossing[turn:] + crossing[:turn])

    def _cp_group(self, rank: int) -> tuple[int, ...]:
        start = rank - self.tp * (rank // self.tp % self.cp)
        return self._group("cp", start, start + self.tp * self.cp, self.tp)

    @cached_property
    def cp_rings(self) -> list[tuple[int, ...]]:
        """rank -> its CP group, the ring its exchanges go round, when CP ranks are folded
        together (`Folding.rings`); empty when they are not."""
        if self._cp_classes == self.cp or self.job.parallel.cp_comm_type != "p2p":
            return []
        return [self._cp_group(rank) for rank in range(self.world)]

    def representative(self, rank: int) -> int:
        """Ranks of one pipeline stage run the same program up to rank ids; the stage's rank with
        tp and dp index 0 and the lowest cp index of its class (`_cp_classes`) stands for them, so
        representatives' pipeline peers are representatives, and so are a ring's or its own class's."""
        c = self.coord(rank)
        return self.rank(Coord(0, c.cp % self._cp_classes, 0, c.pp))

    @cached_property
    def representatives(self) -> list[int]:
        return [self.rank(Coord(0, cp, 0, stage)) for stage in range(self.pp) for cp in range(self._cp_classes)]

    @cached_property
    def stage_heads(self) -> list[int]:
        """The rank with tp, cp and dp index 0 of each pipeline stage."""
        return [self.rank(Coord(0, 0, 0, stage)) for stage in range(self.pp)]

    def where(self) -> tuple[PlacedGroup, ...]:
        """Per role: group size, GPUs of a group per node, nodes a group spans (every group of a
        role has the same shape), for `chakra-sim validate` and results."""
        rows: list[PlacedGroup] = []
        sample = self.groups(0) if self.pp == 1 else {**self.groups(self.stage_heads[-1]), **self.groups(0)}
        for role, members in sample.items():
            nodes = Counter(self.node(r) for r in members)
            rows.append(PlacedGroup(role, len(members), len(nodes), max(nodes.values()),
                                    "NVLink" if len(nodes) == 1 else "network"))
        if self.pp > 1:
            a, b = self.stage_heads[0], self.stage_heads[1]
            same = self.node(a) == self.node(b)
            rows.append(PlacedGroup("pp", self.pp, len({self.node(r) for r in self.stage_heads}),
                                    1 if not same else sum(1 for r in self.stage_heads
                                                           if self.node(r) == self.node(a)),
                                    "NVLink" if same else "network"))
        return tuple(rows)
