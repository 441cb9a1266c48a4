"""A training job: model, parallel layout, training settings and the cluster it runs on.

Field names follow Megatron-LM's arguments where one exists (docs/training.md maps them).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, SerializerFunctionWrapHandler, \
    field_validator, model_serializer, model_validator

from chakra_core.jobs import layout as pipeline_layout
from chakra_core.jobs.allgather_dispatcher import allgather_problems
from chakra_core.jobs.attention_variants import attention_variant_problems
from chakra_core.jobs.context_parallel import hierarchical_problems
from chakra_core.jobs.flex_dispatcher import flex_problems
from chakra_core.jobs.fp8_params import fp8_param_problems
from chakra_core.jobs.mla import latent_attention_problems
from chakra_core.jobs.models import ModelSpec, preset
from chakra_core.jobs.offload import offload_problems
from chakra_core.jobs.optimizer_offload import optimizer_offload_problems
from chakra_core.jobs.param_gathers import param_gather_problems
from chakra_core.jobs.recompute import recompute_problems
from chakra_core.jobs.routing import BALANCED, Routing, routing_problems
from chakra_core.jobs.schedule import schedule_problems
from chakra_core.jobs.shared_expert_overlap import overlap_problems
from chakra_core.jobs.sharding import sharding_problems

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


OVERLAPS = ("overlap_moe_expert_parallel_comm", "delay_wgrad_compute", "moe_shared_expert_overlap")


class Parallel(_Strict):
    tp: PositiveInt = Field(1, description="tensor parallel size (--tensor-model-parallel-size)")
    pp: PositiveInt = Field(1, description="pipeline stages (--pipeline-model-parallel-size)")
    vp: PositiveInt | None = Field(None, description="model chunks per pipeline stage: interleaved 1F1B "
                                                     "(--num-layers-per-virtual-pipeline-stage = layers/pp/vp)")
    cp: PositiveInt = Field(1, description="context parallel size: attention over the sequence in 2 x cp chunks")
    cp_comm_type: Literal["p2p", "a2a", "allgather", "a2a+p2p"] = Field(
        "p2p", description="how context parallel attention communicates (Megatron's --cp-comm-type): 'p2p' ring "
                           "attention, key/value blocks passed around the CP ring beside the steps; 'a2a' "
                           "all-to-alls of q, k, v and the output (Ulysses); 'allgather' key/value blocks gathered "
                           "beside one kernel; 'a2a+p2p' all-to-alls inside groups of the first hierarchical size, "
                           "a ring across them")
    hierarchical_context_parallel_sizes: tuple[PositiveInt, PositiveInt] | None = Field(
        None, description="with a2a+p2p: the all-to-all group's size and the ring's, their product cp "
                          "(--hierarchical-context-parallel-sizes)")
    sp: bool | None = Field(None, description="sequence parallelism with TP; default: on when tp > 1")
    account_for_embedding_and_loss: bool = Field(
        False, description="the pipeline split counts the embedding and the loss as one layer each (Megatron's "
                           "account_for_embedding/loss_in_pipeline_split): the first and last chunk hold one fewer")
    tp_comm_overlap: bool = Field(False, description="TP collectives overlap their GEMMs (TE userbuffers)")
    ep: PositiveInt = Field(1, description="expert parallel size (--expert-model-parallel-size): each rank of an "
                                           "EP group holds num_experts / ep experts")
    etp: PositiveInt | None = Field(None, description="expert tensor parallel size (--expert-tensor-parallel-size): "
                                                      "each expert's FFN split over etp ranks; default tp")
    overlap_moe_expert_parallel_comm: bool = Field(
        False, description="in the steady state of 1F1B one micro-batch's forward and another's backward run "
                           "together, layer by layer, each one's EP all-to-alls beside the other's compute "
                           "(--overlap-moe-expert-parallel-comm; Megatron-Bridge's moe_a2a_overlap)")
    delay_wgrad_compute: bool = Field(False, description=(
        "with overlap_moe_expert_parallel_comm, Transformer Engine's weight gradients run after the data gradients, "
        "where the combined schedule places them (--delay-wgrad-compute)"))
    moe_shared_expert_overlap: bool = Field(False, description="shared experts beside the dispatch "
                                                               "(--moe-shared-expert-overlap)")
    moe_token_dispatcher: Literal["alltoall", "flex", "allgather"] = Field(
        "alltoall", description="--moe-token-dispatcher-type: 'alltoall' all-to-alls over ep (Megatron-Bridge's MoE "
                                "models); 'flex' moe_flex_backend's kernels; 'allgather' (Megatron-Core's default)")
    moe_flex_backend: Literal["deepep", "hybridep"] = Field("deepep", description=(
        "--moe-flex-dispatcher-backend: 'deepep' (NVLink within 8 GPUs, RDMA once per node beyond), 'hybridep' "
        "(NVLink within the NVLink domain, RDMA once per domain beyond)"))
    moe_hybridep_num_sms: PositiveInt | None = Field(None, description="HybridEP's thread blocks "
                                                     "(--moe-hybridep-num-sms): default 16")
    pipeline_layout: str | None = Field(None, description="each virtual stage's layers (--pipeline-model-parallel-"
                                        "layout), e.g. 'Et|(tt|)*30mL': E embedding, t layer, m MTP, L loss; vp follows")
    schedule: Literal["1f1b", "gpipe", "zb-h1"] = Field(
        "1f1b", description="pipeline schedule: '1f1b' Megatron's (interleaved with vp), 'gpipe' every forward then "
                            "every backward, 'zb-h1' zero bubble, weight gradients deferred (jobs/schedule.py)")

    @model_serializer(mode="wrap")
    def _echo(self, handler: SerializerFunctionWrapHandler) -> object:
        # a dense layout echoes (results.json's layout, the job) as before experts were modelled
        data = handler(self)
        if isinstance(data, dict):
            if data.get("ep") == 1:
                data.pop("ep")
            for key in ("etp", "pipeline_layout", "hierarchical_context_parallel_sizes", "moe_hybridep_num_sms"):
                if data.get(key) is None:
                    data.pop(key, None)
            for key in OVERLAPS:   # off: the job's echo as before they were modelled
                if data.get(key) is False:
                    data.pop(key)
            if data.get("schedule") == "1f1b":   # the default: the echo as before schedules were a setting
                data.pop("schedule")
            if data.get("moe_token_dispatcher") != "flex":   # the default, alltoall, echoes as before flex
                data.pop("moe_flex_backend", None)
                if data.get("moe_token_dispatcher") == "alltoall":
                    data.pop("moe_token_dispatcher")
        return data

    @property
    def expert_tp(self) -> int:
        # megatron/training/arguments.py: expert_tensor_parallel_size defaults to tensor_model_parallel_size
        return self.etp or self.tp


class Training(_Strict):
    seq: PositiveInt = Field(..., description="sequence length")
    global_batch: PositiveInt = Field(..., description="sequences per step (GBS)")
    micro_batch: PositiveInt = Field(1, description="sequences per micro-batch (MBS)")
    precision: Literal["bf16", "fp16", "fp8", "nvfp4"] = Field("bf16", description="GEMM precision; fp8 (fp8_recipe) "
                                                                           "and nvfp4 (Blackwell) as Transformer Engine runs them")
    fp8_recipe: Literal["delayed", "current", "mxfp8"] = Field(
        "delayed", description="fp8 scaling: 'delayed' (amax history, reduced once per pass), 'current' "
                               "(per-tensor amax before each cast, Megatron's --fp8-recipe tensorwise) or "
                               "'mxfp8' (a scale per 32 elements, Megatron's --fp8-recipe mxfp8: Blackwell)")
    recompute: Literal["none", "selective", "full"] = Field(
        "none", description="activation recomputation: 'selective' recomputes core attention (free with "
                            "flash attention, which recomputes it anyway), 'full' re-runs each layer's "
                            "forward before its backward")
    recompute_modules: tuple[Literal["core_attn", "layernorm", "moe_act"], ...] | None = Field(
        None, description="with selective: the modules recomputed (Megatron's --recompute-modules; default "
                          "[core_attn]): 'layernorm' the norms that are modules of their own (a MoE layer's "
                          "pre-MLP norm), 'moe_act' the experts' activation; their outputs are dropped after "
                          "the forward and recomputed in the backward")
    attention: Literal["flash", "unfused"] = Field(
        "flash", description="'flash': FlashAttention kernels; 'unfused': batched GEMMs around a fused "
                             "softmax over the s x s scores in memory (Megatron-LM before FlashAttention)")
    attention_kernel: Literal["auto", "flash2", "flash3", "cudnn"] = Field(
        "auto", description="the library of the fused attention kernels (TE's NVTE_FLASH_ATTN/NVTE_FUSED_ATTN): "
                            "'auto' the profile's curves (gpu.achievable.attention_kernel says whose), else "
                            "FlashAttention-2 or -3 or cuDNN, timed with the profile's curves of it")
    dropout: float = Field(0.0, ge=0, lt=1, description="hidden and attention dropout probability (0: no dropout)")
    recompute_layers: PositiveInt | None = Field(
        None, description="with full: layers per stage chunk recomputed (--recompute-num-layers, "
                          "block method); default all")
    distributed_optimizer: bool = Field(True, description="shard optimizer state over data parallel ranks "
                                                          "(--use-distributed-optimizer): gradients "
                                                          "reduce-scattered, parameters all-gathered")
    overlap_grad_reduce: bool = Field(True, description="reduce gradients bucket by bucket in the last backward")
    overlap_param_gather: bool = Field(True, description="all-gather parameters bucket by bucket during "
                                                         "the forward (distributed optimizer only)")
    param_gather_start: Literal["first_forward", "step_start"] = Field(
        "first_forward", description="with overlap_param_gather, when a stage's first bucket is gathered: at its first "
                                     "forward (Megatron-Core 0.9 and later) or at the step's start (0.4 to 0.8; "
                                     "jobs/param_gathers.py)")
    bucket_params: PositiveInt | None = Field(
        None, description="parameters per gradient bucket; default Megatron's max(40M, 1M x dp)")
    fp8_param_gather: bool = Field(
        False, description="fp8 parameters (Megatron's --fp8-param-gather, which Megatron-Bridge's fp8 recipes set): "
                           "Transformer Engine keeps the linear weights in fp8 with no 16-bit copy, the parameter "
                           "all-gathers move them in fp8 (delayed and current scaling) and the optimizer writes "
                           "them (jobs/fp8_params.py); needs precision fp8 and the distributed optimizer or "
                           "Megatron-FSDP")
    grad_reduce_dtype: Literal["fp32", "bf16"] = Field(
        "fp32", description="gradient reduction type (Megatron accumulates and reduces bf16 runs' "
                            "gradients in fp32 unless told otherwise)")
    use_megatron_fsdp: bool = Field(False, description="Megatron-FSDP (--use-megatron-fsdp): dp x cp ranks shard "
                                    "what data_parallel_sharding_strategy says, a layer at a time (jobs/sharding.py)")
    data_parallel_sharding_strategy: Literal["no_shard", "optim", "optim_grads", "optim_grads_params"] | None = Field(
        None, description="with use_megatron_fsdp (default optim_grads_params): sharded are the optimizer state (optim, "
                          "ZeRO-1), and the gradients (optim_grads, ZeRO-2), and the parameters (optim_grads_params)")
    suggested_communication_unit_size: PositiveInt | None = Field(
        None, description="with use_megatron_fsdp: reductions queue up to this many elements, gathers prefetch half")
    num_distributed_optimizer_instances: PositiveInt = Field(
        1, description="with use_megatron_fsdp, hybrid sharding (HSDP): dp x cp ranks in this many replicas, each "
                       "sharding within itself (--num-distributed-optimizer-instances; jobs/sharding.py)")
    cpu_offloading_num_layers: NonNegativeInt = Field(
        0, description="activations of the first k layers copied to host memory after their forward and back before "
                       "their backward (--cpu-offloading-num-layers, Transformer Engine's schedule: jobs/offload.py)")
    optimizer_offload_fraction: float = Field(0.0, ge=0, le=1, description=(
        "optimizer state and step of this fraction of each rank's parameters on the host CPU (--optimizer-cpu-offload "
        "--optimizer-offload-fraction: Megatron's HybridDeviceOptimizer, jobs/optimizer_offload.py)"))
    overlap_cpu_optimizer_d2h_h2d: bool = Field(False, description="--overlap-cpu-optimizer-d2h-h2d")
    routing: Literal["balanced"] | Routing = Field(
        BALANCED, description="how a mixture of experts' router spreads tokens over the experts: 'balanced' (as "
                              "--moe-router-force-load-balancing forces it), {zipf: s} or {histogram: FILE or list} "
                              "(chakra_core/jobs/routing.py)")

    @model_serializer(mode="wrap")
    def _echo(self, handler: SerializerFunctionWrapHandler) -> object:
        # balanced routing and no recompute_modules echo (results.json, the trace cache's digest) as
        # before they were settings
        data = handler(self)
        if isinstance(data, dict):
            if data.get("routing") == BALANCED:
                data.pop("routing")
            for key in ("recompute_modules", "data_parallel_sharding_strategy", "suggested_communication_unit_size"):
                if data.get(key) is None:
                    data.pop(key, None)
            if data.get("use_megatron_fsdp") is False:   # off: the echo as before it was a setting
                data.pop("use_megatron_fsdp")
            for key, off in (("num_distributed_optimizer_instances", 1), ("cpu_offloading_num_layers", 0),
                             ("fp8_param_gather", False), ("attention_kernel", "auto"),
                             ("optimizer_offload_fraction", 0.0), ("overlap_cpu_optimizer_d2h_h2d", False),
                             ("param_gather_start", "first_forward")):
                if data.get(key) == off:
                    data.pop(key)
        return data

    def recomputes(self, module: str) -> bool:
        """Selective recomputation covers `module` (Megatron-Core transformer_config.py at d98e8a64:
        recompute_modules defaults to ["core_attn"])."""
        return self.recompute == "selective" and module in (self.recompute_modules or ("core_attn",))


class Effects(_Strict):
    """What a real step spends beyond its layers' GEMMs, attention and collectives: each can be
    switched off to see what it costs (docs/training-accuracy.md's ablation); all on by default."""

    fp8_overheads: bool = Field(True, description="fp8: Transformer Engine's casts, transposes and amax "
                                                  "reductions around each fp8 GEMM")
    step_overheads: bool = Field(True, description="zeroing the gradient buffers before the step, the "
                                                   "gradient norm (a kernel and its all-reduce) and the "
                                                   "sequence-parallel norm gradients' all-reduce over TP")


class Cluster(_Strict):
    gpus: PositiveInt = Field(..., description="GPUs in the job")
    profile: str = Field(..., description="hardware profile of the nodes and network (chakra-sim profiles)")
    gpus_per_node: PositiveInt | None = Field(None, description="GPUs of the job per NVLink domain; default: "
                                              "the profile's, on NVL72 racks Slurm's segment rule (jobs/domains.py)")


class JobSpec(_Strict):
    """`job:` in a manifest (see docs/training.md)."""

    name: str = Field("job", pattern=r"^[A-Za-z0-9_.-]+$", description="names the generated traces")
    model: ModelSpec = Field(..., description="a preset's name (chakra-sim generate job --list-models) "
                                              "or the shape inline")
    parallel: Parallel = Field(default_factory=Parallel, description="the parallel layout (job.parallel)")
    training: Training = Field(..., description="the step's batch, precision and Megatron settings (job.training)")
    cluster: Cluster = Field(..., description="the GPUs and their profile (job.cluster); may be a top-level `cluster:`")
    effects: Effects = Field(default_factory=Effects,
                             description="what a real step adds, each switchable (job.effects)")
    tensors: bool = Field(False, description="nodes list the tensors the step keeps alive (weights, "
                                             "gradients, optimizer state, saved activations) as Chakra "
                                             "IOInfo, so a memory layer such as hbm finds the peak memory")

    @field_validator("model", mode="before")
    @classmethod
    def _preset(cls, value: object) -> object:
        # A name is looked up before validation, so an inline shape's errors name its own keys
        # rather than a union's branches.
        return preset(value) if isinstance(value, str) else value

    @property
    def shape(self) -> ModelSpec:
        return self.model

    @property
    def sp(self) -> bool:
        p = self.parallel
        return (p.tp > 1) if p.sp is None else (p.sp and p.tp > 1)

    @property
    def layout(self) -> pipeline_layout.Layout | None:
        given = self.parallel.pipeline_layout
        return None if given is None else pipeline_layout.parse(given, self.parallel.pp)

    @property
    def vp(self) -> int:
        return layout.vp if (layout := self.layout) is not None else self.parallel.vp or 1

    @property
    def dp(self) -> int:
        p = self.parallel
        return self.cluster.gpus // (p.tp * p.pp * p.cp)

    @property
    def microbatches(self) -> int:
        """Micro-batches per data-parallel replica and step."""
        t = self.training
        return t.global_batch // (self.dp * t.micro_batch)

    @property
    def pipeline_slots(self) -> int:
        """Layers the pipeline split divides (the embedding and loss counted when asked)."""
        return self.shape.layers + (2 if self.parallel.account_for_embedding_and_loss else 0)

    def chunk_layers(self, stage: int, chunk: int) -> list[int]:
        """The layers of a stage's model chunk: virtual stage chunk x pp + stage, as Megatron assigns them."""
        p = self.parallel
        if p.pipeline_layout is not None:
            return pipeline_layout.parse(p.pipeline_layout, p.pp).transformer_layers(stage, chunk)
        per = self.pipeline_slots // (p.pp * (p.vp or 1))
        skip = 1 if p.account_for_embedding_and_loss else 0
        first = (chunk * p.pp + stage) * per - skip
        return list(range(max(first, 0), min(first + per, self.shape.layers)))

    def warnings(self) -> list[str]:
        """Settings a run accepts but a user should hear about: a sequence past the model's trained
        context, more recomputed layers than a chunk holds."""
        out = []
        m, t, p = self.shape, self.training, self.parallel
        if m.max_seq is not None and t.seq > m.max_seq:
            out.append(f"job.training.seq {t.seq} is longer than model.max_seq {m.max_seq}, the context the "
                       f"model was trained with{' (RoPE: a context extension)' if m.position == 'rope' else ''}")
        if t.recompute_layers is not None:
            most = max(len(self.chunk_layers(stage, chunk)) for stage in range(p.pp) for chunk in range(self.vp))
            if t.recompute_layers > most:
                out.append(f"job.training.recompute_layers {t.recompute_layers} is more than the {most} layers of a "
                           "stage's chunk: every layer is recomputed (as Megatron's block method does)")
        return out

    @property
    def bucket_params(self) -> int:
        # megatron/core/distributed/distributed_data_parallel.py: bucket_size = max(40000000, 1000000 * dp)
        return self.training.bucket_params or max(40_000_000, 1_000_000 * self.dp * self.parallel.cp)

    @model_validator(mode="after")
    def _layout(self) -> "JobSpec":
        m, p, t, c = self.shape, self.parallel, self.training, self.cluster
        problems = []
        if c.gpus % (p.tp * p.pp * p.cp):
            problems.append(f"cluster.gpus {c.gpus} is not divisible by tp x pp x cp = {p.tp * p.pp * p.cp}")
        if m.heads % p.tp or m.groups % p.tp:
            problems.append(f"tp {p.tp} must divide the attention heads ({m.heads}) and key/value heads "
                            f"({m.groups})")
        if m.ffn_hidden % p.tp:
            problems.append(f"tp {p.tp} must divide ffn_hidden {m.ffn_hidden}")
        vp = self.vp
        if p.pipeline_layout is not None:
            problems += pipeline_layout.job_problems(self)
        elif self.pipeline_slots % (p.pp * vp):
            problems.append(pipeline_layout.split_problem(m.layers, p.pp * vp, p.account_for_embedding_and_loss))
        if t.seq % (2 * p.cp) and p.cp > 1:
            problems.append(f"seq {t.seq} must be divisible by 2 x cp = {2 * p.cp} (load-balanced ring "
                            "attention splits it in 2 x cp chunks)")
        if self.sp and (t.seq // p.cp) % p.tp:
            problems.append(f"sequence parallelism needs seq / cp = {t.seq // p.cp} divisible by tp {p.tp}")
        if not problems:
            dp = self.dp
            if t.global_batch % (dp * t.micro_batch):
                problems.append(f"training.global_batch {t.global_batch} is not divisible by dp {dp} x "
                                f"micro_batch {t.micro_batch}")
            elif vp > 1 and self.microbatches % p.pp:
                problems.append(f"interleaved pipelining needs the micro-batches per replica "
                                f"({self.microbatches}) to be a multiple of pp {p.pp}")
            if vp > 1 and p.pp == 1:
                # vp 1 is no interleaving (Megatron-LM@d98e8a64 megatron/training/arguments.py:978)
                problems.append(f"parallel.vp {vp} needs pp > 1 (vp 1 means no interleaving)")
        if p.cp > 1 and p.cp_comm_type == "a2a" and ((m.heads // p.tp) % p.cp or (m.groups // p.tp) % p.cp):
            problems.append(f"cp_comm_type a2a splits each rank's heads over cp: its {m.heads // p.tp} query heads "
                            f"and {m.groups // p.tp} key/value heads (heads / tp, query groups / tp) must be "
                            f"divisible by cp {p.cp}")
        problems += hierarchical_problems(self)
        if t.attention == "unfused" and p.cp > 1:
            problems.append("context parallelism needs training.attention: flash (ring attention)")
        if t.attention == "unfused" and t.attention_kernel != "auto":
            problems.append(f"training.attention_kernel {t.attention_kernel} needs attention: flash")
        problems += _moe_problems(self) + attention_variant_problems(self) + recompute_problems(self) + \
            latent_attention_problems(self) + sharding_problems(self) + schedule_problems(self) + \
            offload_problems(self) + fp8_param_problems(self) + optimizer_offload_problems(self) + \
            param_gather_problems(self)
        if t.recompute_layers is not None and t.recompute != "full":
            problems.append("training.recompute_layers needs recompute: full")
        if m.position == "learned" and m.max_seq is not None and t.seq > m.max_seq:
            problems.append(f"training.seq {t.seq} is longer than model.max_seq {m.max_seq}: learned position "
                            "embeddings have a row per position up to max_seq")
        if problems:
            raise ValueError("; ".join(problems))
        return self


def _moe_problems(job: JobSpec) -> list[str]:
    """The expert layout's rules (Megatron-LM at d98e8a64: megatron/training/arguments.py and
    megatron/core/parallel_state.py), each naming its keys."""
    m, p = job.shape, job.parallel
    if not m.moe:
        return [f"parallel.{key} {getattr(p, key)} needs a mixture of experts (model.num_experts)"
                for key in ("ep", "etp") if (getattr(p, key) or 1) > 1] + \
            [f"parallel.{key} needs a mixture of experts (model.num_experts)" for key in OVERLAPS if getattr(p, key)] \
            + ([f"parallel.moe_token_dispatcher {p.moe_token_dispatcher} needs a mixture of experts "
                "(model.num_experts)"] if p.moe_token_dispatcher != "alltoall" else []) + routing_problems(job)
    out = routing_problems(job)
    experts, ep, etp = m.num_experts or 0, p.ep, p.expert_tp
    if experts % ep:   # "Number of experts should be a multiple of expert model parallel_size."
        out.append(f"parallel.ep {ep} must divide model.num_experts {experts}")
    stage = job.cluster.gpus // p.pp
    if job.cluster.gpus % p.pp == 0 and stage % (ep * etp):
        # the expert RankGenerator (order tp-ep-dp-pp over etp) folds ep x etp into each stage's ranks
        out.append(f"parallel.ep x parallel.etp = {ep} x {etp} must divide a pipeline stage's tp x cp x dp = "
                   f"{stage} ranks (MoE parallel folding)")
    if m.expert_ffn % etp:
        out.append(f"parallel.etp {etp} must divide model.moe_ffn_hidden {m.expert_ffn}")
    if m.shared_ffn % p.tp:
        out.append(f"parallel.tp {p.tp} must divide model.shared_expert_ffn {m.shared_ffn}")
    if m.bias and etp > 1:   # transformer_config.py: "Bias in Moe is only supported when ETP==1"
        out.append(f"model.bias with a mixture of experts needs parallel.etp 1 (it is {etp}; etp defaults to tp)")
    if p.tp > 1 and p.sp is False:
        # megatron/core/transformer/moe/moe_layer.py forward: MoE with TP trains with SP
        out.append("parallel.sp false with tp > 1: Megatron trains MoE layers with sequence parallelism")
    return out + overlap_problems(job) + flex_problems(job) + allgather_problems(job)
