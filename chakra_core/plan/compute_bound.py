"""A tight lower bound on a layout's step: its compute, timed by the run's own compute model.

`layouts.lower_bound_s` counts FLOPs at the fastest rate any kernel reaches; it needs nothing
but the profile, and it is loose (GEMM shapes, norms, activations, the optimizer and kernel gaps
are left out). This bound times the kernels themselves: it builds one layer's forward and
backward (and the embedding, output layer, fp8 weight casts and optimizer step) as the job's
traces hold them (`jobs.program.RankProgram`, one micro-batch, no trace written) and asks the
manifest's compute model for each compute node's duration (the layers built by
`run.build_layers`, as a run of the job builds them). A stage's compute kernels run one
after another on its GPU (`workload.resources.gpu`, default 1, at once), so its step is at least
their sum; the pipeline's fill and drain are added as `lower_bound_s` adds them. Communication,
waiting and overlap are not counted: they only add time.

A layer's kernels depend on tp, cp, sequence parallelism, the micro-batch and the job's fixed
settings, not on pp, vp, dp or the optimizer, so their times are computed once per combination.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from chakra_core.config.build import build_config
from chakra_core.config.spec import RunConfig
from chakra_core.contract.layers import ComputeModel, SystemLayer
from chakra_core.errors import ManifestError, PluginError
from chakra_core.et.attrs import NodeView
from chakra_core.jobs.expand import with_cluster_defaults
from chakra_core.jobs.placement import Placement
from chakra_core.jobs.program import RankProgram
from chakra_core.jobs.spec import JobSpec
from chakra_core.plugins import PluginHost
from chakra_core.run import build_layers
from chakra_core.schema import pb
from chakra_core.json_types import JsonObject

Times = tuple[float, float, float, float, float, float]
"""Seconds of one micro-batch: layer forward, layer backward, embedding forward and backward,
output layer forward and backward."""


class ComputeBound:
    """Step-time bounds from the compute model a job manifest names (see the module docstring)."""

    def __init__(self, manifest: Mapping[str, Any], base_dir: Path, host: PluginHost, profile: str,
                 gpus_per_node: int, gpus: int):
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
        self.gpus_per_node = gpus_per_node
        self._layers: dict[tuple[Any, ...], Times] = {}

    def _compute_ns(self, node: pb.Node) -> int:
        duration = self.model.alone_time_ns(NodeView(node))
        return node.duration_micros * 1000 if duration is None else duration

    def _time(self, nodes: list[pb.Node]) -> float:
        return sum(self._compute_ns(node) for node in nodes if node.type == pb.COMP_NODE) / 1e9

    def _path(self, program: RankProgram, start: int) -> float:
        """Seconds from the start of the nodes built since `start` until the stream's frontier
        (what the next operation waits for): the longest path through them, compute timed by the
        compute model and collectives by the system layer alone (nothing else in flight)."""
        nodes = program.stream.nodes
        groups = {program.names[role]: tuple(members) for role, members in program.groups.items()
                  if role in program.names}
        finish: dict[int, int] = {}
        for node in nodes[start:]:
            ready = max((finish.get(dep, 0) for dep in (*node.data_deps, *node.ctrl_deps)), default=0)
            duration = 0
            if node.type == pb.COMP_NODE:
                duration = self._compute_ns(node)
            elif node.type == pb.COMM_COLL_NODE and self.system is not None:
                view = NodeView(node)
                members = groups.get(view.str("pg_name", ""))
                if members is not None:
                    duration = self.system.idle_collective_ns(view.int("comm_type", 0), view.int("comm_size", 0),
                                                              members) or 0
            finish[node.id] = ready + duration
        return max((finish.get(node_id, 0) for node_id in program.stream.frontier), default=0) / 1e9

    def _pieces(self, spec: JobSpec, program: RankProgram) -> Times:
        p, t = spec.parallel, spec.training
        key = (p.tp, p.cp, spec.sp, p.tp_comm_overlap, t.micro_batch)
        known = self._layers.get(key)
        if known is not None:
            return known
        stream = program.stream

        def timed(build: Any, *args: Any) -> float:
            start = len(stream.nodes)
            build(*args)
            return self._path(program, start)

        layer = 0   # every layer has the same kernels; only their names carry the index
        known = (timed(program.layer_forward, 0, layer), timed(program.layer_backward, 0, layer),
                 timed(program.embedding_forward, 0), timed(program.embedding_backward, 0),
                 timed(program.head_forward, 0), timed(program.head_backward, 0))
        self._layers[key] = known
        return known

    def bound_s(self, spec: JobSpec) -> float:
        """Seconds no simulated step of `spec` can beat (see the module docstring)."""
        p, t = spec.parallel, spec.training
        placement = Placement(spec, self.gpus_per_node)
        reps = placement.representatives
        stage_rank = {placement.coord(rank).pp: rank for rank in reps}
        first = RankProgram(spec, placement, stage_rank[0])
        first.plan_buckets()
        forward, backward, emb_f, emb_b, head_f, head_b = self._pieces(spec, first)
        full = t.recompute == "full"

        def chunk(stage: int, index: int) -> float:
            layers = len(spec.chunk_layers(stage, index))
            recomputed = min(layers, t.recompute_layers or layers) if full else 0
            extra = (emb_f + emb_b if (stage, index) == (0, 0) else 0.0) + \
                (head_f + head_b if (stage, index) == (p.pp - 1, spec.vp - 1) else 0.0)
            return layers * (forward + backward) + recomputed * forward + extra

        micro = spec.microbatches
        best, fill = 0.0, 0.0
        for stage in range(p.pp):
            work = micro * sum(chunk(stage, index) for index in range(spec.vp)) + self._per_step(spec, placement,
                                                                                                 stage_rank[stage])
            best = max(best, fill + work / self.streams)
            fill += chunk(stage, 0)
        return best

    def _per_step(self, spec: JobSpec, placement: Placement, rank: int) -> float:
        """The stage's kernels run once per step: fp8 weight casts and the optimizer."""
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
