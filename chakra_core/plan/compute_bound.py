"""A tight lower bound on a layout's step: its compute, timed by the run's own compute model.

`layouts.lower_bound_s` counts FLOPs at the fastest rate any kernel reaches; it needs nothing
but the profile, and it is loose (GEMM shapes, norms, activations, the optimizer and kernel gaps
are left out). This bound times the kernels themselves: it builds one layer's forward and
backward (and the embedding, output layer, fp8 weight casts and optimizer step) as the job's
traces hold them (`jobs.program.RankProgram`, one micro-batch, no trace written) and asks the
manifest's compute model for each compute node's duration (the layers built by
`run.build_layers`, as a run of the job builds them). A stage's compute kernels run one
after another on its GPU (`workload.resources.gpu`, default 1, at once), so its step is at least
their sum; the pipeline's fill and drain are added as `lower_bound_s` adds them. The collectives
on a layer's own critical path count at their time alone (the system layer's
`idle_collective_ns`); contention, waiting and other communication only add time. A mixture of
experts' EP communication under --overlap-moe-expert-parallel-comm counts 0 on that path: the
combined 1F1B schedule may hide it behind another micro-batch's compute. It cannot hide it behind
itself: every dispatch and combine all-to-all of a stage runs on one communication stream, one
after another (`jobs.moe_overlap`: a sub-module waits for its stream's last node, and a merged
step for the last one's), so the stage's step is also at least its fill plus the sum of its
all-to-alls over EP, each at its time alone.

A layer's kernels depend on tp, cp, sequence parallelism, the micro-batch, a mixture of experts'
ep and etp and the job's fixed settings, not on pp, vp, dp or the optimizer, so their times are
computed once per combination; a mixture of experts' dense layers (dense_layers_first) and MoE
layers are timed apart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, NamedTuple

from chakra_core.config.build import build_config
from chakra_core.config.spec import RunConfig
from chakra_core.contract.layers import ComputeModel, SystemLayer
from chakra_core.errors import ManifestError, PluginError
from chakra_core.et.attrs import NodeView
from chakra_core.jobs.expand import with_cluster_defaults
from chakra_core.jobs.optimizer_offload import HostOptimizer
from chakra_core.jobs.placement import Placement
from chakra_core.jobs.primitives import EP_PART
from chakra_core.jobs.program import RankProgram
from chakra_core.jobs.spec import JobSpec
from chakra_core.plugins import PluginHost
from chakra_core.run import build_layers
from chakra_core.schema import pb
from chakra_core.json_types import JsonObject

class Times(NamedTuple):
    """Seconds of one micro-batch's pieces, each its forward and backward."""

    layer: tuple[float, float]     # a dense layer (0, 0: the model has none)
    moe: tuple[float, float]       # a mixture of experts' MoE layer (0, 0: the model has none)
    moe_ep: tuple[float, float]    # its all-to-alls over EP, one after another, each alone
    embedding: tuple[float, float]
    head: tuple[float, float]      # the output layer and the loss


class ComputeBound:
    """Step-time bounds from the compute model a job manifest names (see the module docstring)."""

    def __init__(self, manifest: Mapping[str, Any], base_dir: Path, host: PluginHost, profile: str,
                 gpus_per_node: int, gpus: int, architecture: str, host_optimizer: HostOptimizer | None = None):
        if not isinstance((manifest.get("compute") or {}).get("plugin"), str):
            raise ManifestError([("compute.plugin", "required: the compute layer plan times kernels with")])
        config = _layers_config(manifest, base_dir, host, profile, gpus_per_node)
        # as a run of the job builds them: for its ranks (the compute model's GPU variation, as
        # `achievable` models it, is the slowest of them)
        layers = build_layers(config, host, ranks=gpus)
        model = layers["compute"]
        if not isinstance(model, ComputeModel):
            raise ManifestError([("compute.plugin", f"'{model.name}' is not a compute layer")])
        self.model = model
        # a system layer that times collectives alone (without a network) says how long one takes;
        # otherwise collectives count 0 in the bound
        system = layers["system"]
        self.system = system if isinstance(system, SystemLayer) and "network" not in manifest else None
        self.streams = max(1, config.spec.resources.gpu or 1)
        self.gpus_per_node, self.architecture = gpus_per_node, architecture
        self.host_optimizer = host_optimizer   # with optimizer offload: the host's rates (jobs/optimizer_offload.py)
        self._layers: dict[tuple[Any, ...], Times] = {}
        self._steps: dict[tuple[Any, ...], float] = {}

    def _compute_ns(self, node: pb.Node) -> int:
        duration = self.model.alone_time_ns(NodeView(node))
        return node.duration_micros * 1000 if duration is None else duration

    def _time(self, nodes: list[pb.Node]) -> float:
        """The GPU's kernels one after another; the host's optimizer steps (CPU nodes), which run
        beside the GPU's own Adam, are left out so the sum stays below any step."""
        return sum(self._compute_ns(node) for node in nodes
                   if node.type == pb.COMP_NODE and not NodeView(node).is_cpu_op) / 1e9

    def _path(self, program: RankProgram, start: int) -> float:
        """Seconds from the start of the nodes built since `start` until the stream's frontier
        (what the next operation waits for): the longest path through them, compute timed by the
        compute model and collectives by the system layer alone (nothing else in flight)."""
        nodes = program.stream.nodes
        groups = {program.names[role]: tuple(members) for role, members in program.groups.items()
                  if role in program.names}
        # with the combined 1F1B schedule one micro-batch's EP communication runs beside another's
        # compute (--overlap-moe-expert-parallel-comm): counted 0, as it may be hidden
        hidden = EP_PART if program.job.parallel.overlap_moe_expert_parallel_comm else None
        finish: dict[int, int] = {}
        for node in nodes[start:]:
            ready = max((finish.get(dep, 0) for dep in (*node.data_deps, *node.ctrl_deps)), default=0)
            duration = 0
            if node.type == pb.COMP_NODE:
                duration = self._compute_ns(node)
            elif node.type == pb.COMM_COLL_NODE and self.system is not None:
                view = NodeView(node)
                members = groups.get(view.str("pg_name", ""))
                if members is not None and view.str("step_part", "") != hidden:
                    duration = self.system.idle_collective_ns(view.int("comm_type", 0), view.int("comm_size", 0),
                                                              members) or 0
            finish[node.id] = ready + duration
        return max((finish.get(node_id, 0) for node_id in program.stream.frontier), default=0) / 1e9

    def _ep_all_to_alls(self, program: RankProgram, start: int, end: int) -> float:
        """Seconds of the all-to-alls over the EP group among nodes start..end-1, each
        alone, summed (those of the flex dispatcher's two fabrics run at once and count 0)."""
        group, members = program.names.get("ep"), program.groups.get("ep")
        if self.system is None or group is None or members is None:
            return 0.0
        ranks, total = tuple(members), 0
        for node in program.stream.nodes[start:end]:
            if node.type != pb.COMM_COLL_NODE:
                continue
            view = NodeView(node)
            if view.str("pg_name", "") == group and view.int("comm_type", 0) == pb.ALL_TO_ALL:
                total += self.system.idle_collective_ns(pb.ALL_TO_ALL, view.int("comm_size", 0), ranks) or 0
        return total / 1e9

    def _pieces(self, spec: JobSpec, placement: Placement, rank: int) -> Times:
        p, t, m = spec.parallel, spec.training, spec.shape
        key = (p.tp, p.cp, spec.sp, p.tp_comm_overlap, t.micro_batch, p.ep, p.expert_tp)
        known = self._layers.get(key)
        if known is not None:
            return known
        program = RankProgram(spec, placement, rank)
        program.plan_buckets()
        stream = program.stream

        def timed(build: Any, *args: Any) -> float:
            start = len(stream.nodes)
            build(*args)
            return self._path(program, start)

        def layer(index: int | None) -> tuple[tuple[float, float], tuple[float, float]]:
            """A layer's forward and backward, and their all-to-alls over EP."""
            # layers of a kind have the same kernels; only their names carry the index
            if index is None:
                return (0.0, 0.0), (0.0, 0.0)
            start = len(stream.nodes)
            forward = timed(program.layer_forward, 0, index)
            middle = len(stream.nodes)
            backward = timed(program.layer_backward, 0, index)
            return (forward, backward), (self._ep_all_to_alls(program, start, middle),
                                         self._ep_all_to_alls(program, middle, len(stream.nodes)))

        dense_times, _ = layer(0 if m.first_moe_layer > 0 or not m.moe else None)
        moe_times, moe_ep = layer(m.first_moe_layer if m.moe else None)
        known = Times(dense_times, moe_times, moe_ep,
                      (timed(program.embedding_forward, 0), timed(program.embedding_backward, 0)),
                      (timed(program.head_forward, 0), timed(program.head_backward, 0)))
        self._layers[key] = known
        return known

    def bound_s(self, spec: JobSpec) -> float:
        """Seconds no simulated step of `spec` can beat (see the module docstring)."""
        p, t, m = spec.parallel, spec.training, spec.shape
        placement = Placement(spec, self.gpus_per_node, self.architecture, self.host_optimizer)
        reps = placement.representatives
        stage_rank = {placement.coord(rank).pp: rank for rank in reps}
        pieces = self._pieces(spec, placement, stage_rank[0])
        (emb_f, emb_b), (head_f, head_b) = pieces.embedding, pieces.head
        times = {False: pieces.layer, True: pieces.moe}
        full = t.recompute == "full"

        def chunk(stage: int, index: int) -> float:
            layers = spec.chunk_layers(stage, index)
            recomputed = layers[:t.recompute_layers or len(layers)] if full else []
            extra = (emb_f + emb_b if (stage, index) == (0, 0) else 0.0) + \
                (head_f + head_b if (stage, index) == (p.pp - 1, spec.vp - 1) else 0.0)
            kinds = [m.is_moe_layer(layer) for layer in layers]
            moe, moe_recomputed = sum(kinds), sum(map(m.is_moe_layer, recomputed))
            (forward, backward), (moe_f, moe_b) = times[False], times[True]
            # dense layers first: a dense model's sum is what it was before experts (0 MoE layers add 0.0)
            return (len(layers) - moe) * (forward + backward) + moe * (moe_f + moe_b) \
                + ((len(recomputed) - moe_recomputed) * forward + moe_recomputed * moe_f) + extra

        micro = spec.microbatches
        ep_layer = sum(pieces.moe_ep) if p.overlap_moe_expert_parallel_comm else 0.0
        best, fill = 0.0, 0.0
        for stage in range(p.pp):
            work = micro * sum(chunk(stage, index) for index in range(spec.vp)) + self._per_step(spec, placement,
                                                                                                 stage_rank[stage])
            moe_layers = sum(m.is_moe_layer(layer) for index in range(spec.vp)
                             for layer in spec.chunk_layers(stage, index))
            best = max(best, fill + max(work / self.streams, micro * moe_layers * ep_layer))
            fill += chunk(stage, 0)
        return best

    def _per_step(self, spec: JobSpec, placement: Placement, rank: int) -> float:
        """The stage's kernels run once per step: fp8 weight casts and the optimizer. They depend on
        the stage's parameters and their shards, not on the micro-batch or recomputation, so layouts
        that differ only there share them (every layout of a MoE search that fits is bounded)."""
        p = spec.parallel
        key = (p.tp, p.cp, spec.dp, p.pp, spec.vp, p.ep, p.expert_tp, spec.training.distributed_optimizer,
               placement.coord(rank).pp)
        known = self._steps.get(key)
        if known is None:
            known = self._steps[key] = self._stage_step(spec, placement, rank)
        return known

    def _stage_step(self, spec: JobSpec, placement: Placement, rank: int) -> float:
        program = RankProgram(spec, placement, rank)
        buckets = program.plan_buckets()
        stream = program.stream
        start = len(stream.nodes)
        for index in range(spec.vp):
            for layer in program.chunk_layers(index):
                program._fp8_weights(layer)
        stage_params = sum(size for _, size in buckets)
        shards = len(program.groups.get("dp_cp", (0,)))
        dist = spec.training.distributed_optimizer and program.dp_group is not None
        program._optimizer(stage_params, shards, dist, buckets)
        return self._time(stream.nodes[start:])


def _layers_config(manifest: Mapping[str, Any], base_dir: Path, host: PluginHost, profile: str,
                   gpus_per_node: int) -> RunConfig:
    """The job's compute and system layers (and network, which a system may need) with the
    cluster's profile and GPUs per node where a run of the job gives them (jobs.expand), as a
    run's configuration without traces: the kernels are timed one by one, nothing is simulated."""
    defaults = {"profile": profile, "gpus-per-node": gpus_per_node}
    workload = {key: value for key, value in (manifest.get("workload") or {}).items() if key == "resources"}
    data: JsonObject = {"workload": {"trace": "(plan: no trace)", **workload}}
    for layer in ("compute", "system", "network"):
        section = manifest.get(layer)
        if not isinstance(section, Mapping) or not isinstance(section.get("plugin"), str):
            continue
        try:
            config_cls = host.get(layer, section["plugin"]).cls.Config
        except PluginError:
            data[layer] = dict(section)   # build_config names the installed plugins
            continue
        data[layer] = with_cluster_defaults(config_cls, section, defaults)
    return build_config(data, host, base_dir, "plan", traces=[])
