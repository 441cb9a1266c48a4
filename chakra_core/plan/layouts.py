"""The parallel layouts of a training job, and a lower bound on the step time of each.

Search space. A layout is what Megatron-LM lets one choose for a fixed model, cluster and global
batch: tensor parallel size tp (a divisor of the GPUs, within one node's NVLink domain, as
Megatron's rank order keeps TP inside a node), pipeline stages pp (a divisor of the GPUs),
model chunks per stage vp (the layers per virtual chunk an integer; vp > 1 only with pp > 1),
context parallel size cp (a power of two up to `max_cp`), the micro-batch size, activation
recomputation (none / selective / full) and the distributed optimizer; dp = GPUs / (tp pp cp)
follows. A mixture of experts adds the expert parallel size ep (a divisor of num_experts) and the
expert tensor parallel size etp (by default tp, Megatron's default, and 1, what published MoE
recipes run); `sharding` adds Megatron-FSDP's strategies beside Megatron's data parallelism
(`megatron`: its DDP with or without the distributed optimizer; `optim`, `optim_grads`,
`optim_grads_params`: ZeRO-1/2/3 as jobs.sharding lays them out, which runs the distributed optimizer); MoE parallel folding lays ep x etp over each pipeline stage's tp x cp x dp ranks,
so ep x etp must divide them (megatron/core/parallel_state.py at d98e8a64: the expert
RankGenerator), and edp = tp cp dp / (ep etp) follows. Which combinations are valid is
`JobSpec`'s validator's decision (heads and ffn_hidden divisible by tp, layers by pp x vp, seq by
2 cp, the global batch by dp x micro-batch, interleaving needing micro-batches divisible by pp,
the expert rules: Megatron-LM's own argument checks in megatron/training/arguments.py); this
module only skips the subtrees where tp pp cp does not divide the GPUs, tp leaves the node, ep
does not divide the experts or ep etp does not divide a stage's ranks before asking it.

Lower bound. The simulated step of a layout under the job's compute model is never shorter than
`lower_bound_s`: the GEMM and attention FLOPs of the busiest pipeline stage, at rates the compute
model never exceeds (its `matmul_ceiling_flops` and `attention_ceiling_flops`, else the profile's
dense peaks), plus the pipeline's fill and drain. For equal stages it is the work
per GPU times (1 + (p - 1) / (m v)), the bubble of (interleaved) 1F1B (Narayanan et al., SC'21,
arXiv 2104.04473, section 2.2.2: the bubble (p - 1) / (m v) of the ideal compute time).
"""

from __future__ import annotations

import math
import re
from collections import Counter
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from pydantic import ValidationError

from chakra_core.contract.layers import ComputeModel
from chakra_core.hardware.profiles import Profile
from chakra_core.jobs.fp8 import gemm_dtype
from chakra_core.jobs.hybrid_ep import hybridep_problem
from chakra_core.jobs.models import ModelSpec, preset
from chakra_core.jobs.sharding import DEFAULT_STRATEGY
from chakra_core.jobs.spec import Cluster, JobSpec
from chakra_core.plan.expert_memory import routed_copies
from chakra_core.json_types import JsonObject

RECOMPUTE = ("none", "selective", "full")

MAX_PLANNED_GPUS = 1 << 24
"""GPUs a plan searches at most (16,777,216: divisors are found by trial division up to the square
root, 4,096 steps; far above any cluster built)."""
OUTSIDE_NODE = "tp beyond the NVLink domain"
GPUS_NOT_DIVISIBLE = "GPUs not divisible by tp x pp x cp"
EP_NOT_DIVIDING = "ep does not divide the experts"
NOT_FOLDING = "ep x etp does not divide a stage's tp x cp x dp ranks"
HYBRIDEP_DOMAINS = "ep does not split into HybridEP's NVLink domains"
FSDP_PIPELINE = "Megatron-FSDP with pp > 1 (not modelled)"
MEGATRON = "megatron"
"""Layout.sharding: Megatron's own data parallelism (DDP, with or without the distributed optimizer)."""
SHARDINGS = (MEGATRON, "optim", "optim_grads", "optim_grads_params")
FSDP_KEYS = ("use_megatron_fsdp", "data_parallel_sharding_strategy", "suggested_communication_unit_size")
ETP_CHOICES: tuple[int | None, ...] = (None, 1)
"""Expert tensor parallel sizes searched by default: None is tp (Megatron's default for
--expert-tensor-parallel-size), 1 what the published MoE recipes run (Megatron-Bridge's Qwen3,
DeepSeek-V3 and Mixtral performance configs: expert_tensor_parallel_size=1)."""
_REASONS: tuple[tuple[str, str], ...] = (
    # a phrase of JobSpec._layout's message -> the short reason it is counted under
    ("not divisible by tp x pp x cp", GPUS_NOT_DIVISIBLE),
    ("must divide the attention heads", "tp does not divide the heads"),
    ("must divide ffn_hidden", "tp does not divide ffn_hidden"),
    ("not divisible by pp x vp", "layers not divisible by pp x vp"),
    ("divisible by 2 x cp", "seq not divisible by 2 x cp"),
    ("sequence parallelism needs", "sequence parallelism needs seq / cp divisible by tp"),
    ("is not divisible by dp", "global batch not divisible by dp x micro-batch"),
    ("interleaved pipelining needs", "interleaving needs micro-batches divisible by pp"),
    ("vp needs pp > 1", "interleaving needs pp > 1"),
    ("context parallelism needs", "cp needs flash attention"),
    ("recompute_layers needs", "recompute_layers needs full recompute"),
    ("must divide model.num_experts", EP_NOT_DIVIDING),
    ("(MoE parallel folding)", NOT_FOLDING),
    ("must divide model.moe_ffn_hidden", "etp does not divide moe_ffn_hidden"),
    ("must divide model.shared_expert_ffn", "tp does not divide shared_expert_ffn"),
    ("Megatron trains MoE layers with sequence", "MoE layers with tp > 1 need sequence parallelism"),
    ("overlap_moe_expert_parallel_comm with pp > 1 needs", "EP overlap needs vp > 1 with pp > 1"),
    ("overlap_moe_expert_parallel_comm needs parallel.ep", "EP overlap needs ep > 1"),
    ("overlap_moe_expert_parallel_comm needs training.recompute", "EP overlap needs no full recompute"),
    ("recompute full with optim_grads_params", "Megatron-FSDP optim_grads_params with full recompute (not modelled)"),
    ("training.use_megatron_fsdp with", "a Megatron-FSDP setting not modelled"),
)


@dataclass(frozen=True, order=True)
class Layout:
    """One way to lay the job out; fields in the order layouts sort by."""

    tp: int
    pp: int
    vp: int                 # 1: no interleaving (parallel.vp: None)
    cp: int
    dp: int
    micro_batch: int
    recompute: str
    distributed_optimizer: bool
    ep: int = 1
    etp: int | None = None   # a mixture of experts' expert TP size; None: a dense model's layout
    sharding: str | None = None
    """None: as the job says (sharding not searched); `megatron`: Megatron's data parallelism; else a
    Megatron-FSDP data_parallel_sharding_strategy."""
    offload: int = 0
    """Layers whose activations go to host memory (plan.offload); 0: as the job says."""
    optimizer_offload: float = 0.0
    """Share of the optimizer state and step on the host (plan.offload); 0: as the job says."""

    @property
    def fsdp(self) -> bool:
        return self.sharding not in (None, MEGATRON)

    @property
    def moe(self) -> bool:
        return self.etp is not None

    @property
    def edp(self) -> int:
        """Expert data parallel size: a stage's tp x cp x dp ranks over ep x etp (MoE folding)."""
        return self.tp * self.cp * self.dp // (self.ep * (self.etp or self.tp))

    def overrides(self) -> JsonObject:
        """Key paths of a job manifest -> values; dp (and edp) are implied by the GPU count, never set."""
        experts: JsonObject = {"job.parallel.ep": self.ep, "job.parallel.etp": self.etp} if self.moe else {}
        sharded: JsonObject = {}
        if self.sharding == MEGATRON:
            sharded = {f"job.training.{key}": False if key == "use_megatron_fsdp" else None for key in FSDP_KEYS}
        elif self.sharding is not None:
            sharded = {"job.training.use_megatron_fsdp": True, "job.training.data_parallel_sharding_strategy": self.sharding}
        return {"job.parallel.tp": self.tp, "job.parallel.pp": self.pp,
                "job.parallel.vp": self.vp if self.vp > 1 else None, "job.parallel.cp": self.cp, **experts,
                "job.training.micro_batch": self.micro_batch, "job.training.recompute": self.recompute,
                "job.training.distributed_optimizer": self.distributed_optimizer, **sharded,
                **({"job.training.cpu_offloading_num_layers": self.offload} if self.offload else {}),
                **({"job.training.optimizer_offload_fraction": self.optimizer_offload} if self.optimizer_offload else {})}

    def label(self) -> str:
        optimizer = f"fsdp-{self.sharding}" if self.fsdp else "dist-opt" if self.distributed_optimizer else "no-dist-opt"
        experts = f" EP{self.ep} ETP{self.etp}" if self.moe else ""
        return (f"TP{self.tp} PP{self.pp} VP{self.vp} CP{self.cp} DP{self.dp}{experts} MB{self.micro_batch} "
                f"{self.recompute} {optimizer}" + (f" offload{self.offload}" if self.offload else "") +
                (f" opt-offload{self.optimizer_offload:g}" if self.optimizer_offload else ""))


@dataclass
class Enumeration:
    layouts: list[Layout]                                  # the valid ones, sorted
    tried: int                                             # combinations considered
    rejected: dict[str, int] = field(default_factory=dict)  # reason -> combinations; adds up with layouts to tried
    specs: dict[Layout, JobSpec] = field(default_factory=dict)  # each valid layout's job, as validated


def enumerate_layouts(job: Mapping[str, Any], gpus_per_node: int, *, micro_batches: Sequence[int] = (1, 2, 4, 8),
                      recompute: Sequence[str] = RECOMPUTE, distributed_optimizer: Sequence[bool] = (True, False),
                      max_cp: int = 8, ep: Sequence[int] | None = None,
                      etp: Sequence[int | None] = ETP_CHOICES, sharding: Sequence[str | None] = (None,)) -> Enumeration:
    """Every valid layout of `job` (a manifest's `job:` mapping, its cluster included); the
    job's other keys (precision, seq, global batch, tp_comm_overlap, ...) are kept as given.
    A mixture of experts' layouts also take each expert parallel size of `ep` (default: every
    divisor of num_experts) and expert tensor parallel size of `etp` (None: tp); a dense model's
    take neither. `sharding` (SHARDINGS; None: as the job says) searches Megatron-FSDP's strategies
    beside Megatron's data parallelism; an FSDP layout runs the distributed optimizer. A
    ValidationError or ValueError says what is wrong with the job whatever the layout (its cluster
    or model)."""
    gpus = Cluster.model_validate(job.get("cluster")).gpus
    base = {**job, "model": _model(job.get("model"))}
    parallel = job.get("parallel") or {}
    slots = base["model"].layers + (2 if isinstance(parallel, Mapping)
                                    and parallel.get("account_for_embedding_and_loss") else 0)
    unknown = [value for value in sharding if value is not None and value not in SHARDINGS]
    if unknown:
        raise ValueError(f"sharding {unknown[0]!r}: expected one of {', '.join(SHARDINGS)}")
    schedule = parallel.get("schedule", "1f1b") if isinstance(parallel, Mapping) else "1f1b"
    if schedule != "1f1b":   # lower_bound_s's fill and drain are 1F1B's
        raise ValueError(f"job.parallel.schedule {schedule}: plan searches Megatron's 1F1B layouts only; "
                         "remove parallel.schedule to plan the job")
    inner = [(mb, rc, do, sh) for mb in _unique(micro_batches) for rc in _unique(recompute)
             for sh in _unique(sharding)
             for do in (_unique(distributed_optimizer) if sh in (None, MEGATRON) else [True])]
    cps = [1 << i for i in range(max(0, max_cp).bit_length()) if 1 << i <= max_cp]
    specs: dict[Layout, JobSpec] = {}
    tried, rejected = 0, Counter[str]()
    if gpus > MAX_PLANNED_GPUS:
        raise ValueError(f"cluster.gpus {gpus:,} is more than plan searches ({MAX_PLANNED_GPUS:,})")
    divisors = _divisors(gpus)
    # chunks of whole layers; otherwise vp 1 alone, for JobSpec to reject
    vps_of = {pp: [v for v in _divisors(slots // pp) if pp > 1 or v == 1] if slots % pp == 0 else [1]
              for pp in divisors}
    experts = base["model"].num_experts
    eps = [1] if experts is None else _unique(ep) if ep is not None else _divisors(experts)
    per_tp = sum(len(vps) for vps in vps_of.values()) * len(cps) * len(inner)
    for tp in divisors:
        # a dense model's layouts take no expert sizes (etp None); a MoE's every (ep, etp)
        expert_sizes = [(1, None)] if experts is None else [(e, t) for e in eps
                                                            for t in _unique(tp if v is None else v for v in etp)]
        if tp > gpus_per_node:   # the whole subtree, counted without walking it
            tried += per_tp * len(expert_sizes)
            rejected[OUTSIDE_NODE] += per_tp * len(expert_sizes)
            continue
        for pp in divisors:
            vps = vps_of[pp]
            for cp in cps:
                subtree = len(vps) * len(inner) * len(expert_sizes)
                tried += subtree
                if gpus % (tp * pp * cp):
                    rejected[GPUS_NOT_DIVISIBLE] += subtree
                    continue
                dp = gpus // (tp * pp * cp)
                for ep_, etp_ in expert_sizes:
                    skipped = _experts_skipped(experts, ep_, etp_, tp * cp * dp)
                    if skipped is not None:
                        rejected[skipped] += len(vps) * len(inner)
                        continue
                    for vp in vps:
                        for mb, rc, do, sh in inner:
                            layout = Layout(tp, pp, vp, cp, dp, mb, rc, do, ep_, etp_, sh)
                            if layout.fsdp and pp > 1:   # jobs.sharding: one pipeline stage
                                rejected[FSDP_PIPELINE] += 1
                                continue
                            try:
                                spec = _spec(base, layout)
                            except ValidationError as exc:
                                rejected[_reason(exc)] += 1
                                continue
                            if hybridep_problem(spec, gpus_per_node):   # expansion would refuse it
                                rejected[HYBRIDEP_DOMAINS] += 1
                            else:
                                specs[layout] = spec
    return Enumeration(sorted(specs), tried, dict(sorted(rejected.items())), specs)


def sharding_searched(job: Mapping[str, Any], search: dict[str, Any], marked: tuple[Layout, ...]) -> tuple[Layout, ...]:
    """A job with use_megatron_fsdp is searched with its own strategy unless `search` names some (set
    in `search`); when strategies are searched, `marked` layouts of Megatron's data parallelism
    (sharding None) are named as the search names them. Returns the marked layouts."""
    training = job.get("training")
    if "sharding" not in search and isinstance(training, Mapping) and training.get("use_megatron_fsdp"):
        search["sharding"] = (training.get("data_parallel_sharding_strategy") or DEFAULT_STRATEGY,)
    if "sharding" not in search:
        return marked
    return tuple(dataclasses.replace(m, sharding=MEGATRON) if m.sharding is None else m for m in marked)


def _experts_skipped(experts: int | None, ep: int, etp: int | None, stage: int) -> str | None:
    """Why JobSpec would reject every layout of an expert layout whatever the rest (None: it may not)."""
    if experts is None or etp is None:
        return None
    if experts % ep:
        return EP_NOT_DIVIDING
    return NOT_FOLDING if stage % (ep * etp) else None


def job_with(job: Mapping[str, Any], layout: Layout) -> JobSpec:
    """The validated JobSpec of `job` laid out as `layout` (ValidationError if it is not valid)."""
    return _spec(job, layout)


def _spec(job: Mapping[str, Any], layout: Layout) -> JobSpec:
    data: JsonObject = {**job}
    for path, value in layout.overrides().items():
        _, section, key = path.split(".")
        current = data.get(section)
        data[section] = {**(current if isinstance(current, Mapping) else {}), key: value}
    return JobSpec.model_validate(data)


def _model(model: Any) -> ModelSpec:
    """The model resolved once, so that each layout's JobSpec reuses it."""
    if isinstance(model, str):
        return preset(model)
    return model if isinstance(model, ModelSpec) else ModelSpec.model_validate(model)


def _reason(exc: ValidationError) -> str:
    """A rejected layout's first problem, as a short reason (numbers dropped) to count it under."""
    message = str(exc.errors()[0]["msg"]).removeprefix("Value error, ").split("; ")[0]
    for phrase, reason in _REASONS:
        if phrase in message:
            return reason
    return re.sub(r"\d+", "N", message)


def _divisors(n: int) -> list[int]:
    """The divisors of n in order (trial division up to its square root)."""
    low = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return low + [n // d for d in reversed(low) if d * d != n]


def _unique(values: Iterable[Any]) -> list[Any]:
    return list(dict.fromkeys(values))


# The lower bound -----------------------------------------------------------------------------------
def lower_bound_s(spec: JobSpec, profile: Profile, compute: ComputeModel | None = None) -> float:
    """Seconds no simulated step of `spec` under the compute model `compute` can beat (None: a
    model that runs no kernel above the profile's dense peaks).

    Why each part can only be below what the simulation gives:
    - only GEMMs (linear layers, output layer) and attention are counted, with the FLOPs
      `jobs.kernels` gives their nodes; norms, activations, cross entropy, the optimizer step,
      kernel gaps and every exposed communication add time;
    - each is timed at a rate the compute model never exceeds, as the model says (`_Rates`); the
      `achievable` model's: a GEMM at the MAMF of its type (tile and wave quantization and the
      HBM bound only slow it), attention at the highest point of its FlashAttention curve
      (interpolation stays between points, too few CTAs only slow it);
    - compute kernels of a rank run one after another (a stream), so a stage takes at least the
      sum of its kernels;
    - pipeline fill and drain: stage j starts with the forward of micro-batch 0 in its chunk 0
      and ends with the backward of the last micro-batch in chunk 0 (schedule.stage_schedule,
      1F1B and interleaved), so before it the forward and after it the backward of chunk 0 of
      every earlier stage run, one after the other:
          step >= max_j [ sum_{i<j} chunk0_i + work_j ].
      With equal stages that is work (1 + (p - 1) / (m v)), SC'21's bubble; taking it stage by
      stage keeps it a bound when stages differ (the output layer on the last stage, a first or
      last chunk a layer short): the average work times the bubble factor is not a bound when
      early stages are the heavier ones.
    """
    m, p, t = spec.shape, spec.parallel, spec.training
    rates = _Rates(profile, gemm_dtype(t), compute)   # MXFP8's GEMMs at its rate
    b, s, tp, cp = t.micro_batch, t.seq, p.tp, p.cp
    n = b * s // cp                                     # tokens of a micro-batch on this rank
    a, g, d, h, f = m.heads // tp, m.groups // tp, m.head_dim, m.hidden, m.ffn_hidden // tp
    attention_linear = 2 * n * (h * (a + 2 * g) * d + a * d * h)   # qkv, proj
    if m.mla:   # latent attention's projections and head sizes differ: left out (the bound stays one)
        attention_linear, attention_f, attention_b = 0, 0.0, 0.0
    elif t.attention == "flash":   # causal, split over CP; FlashAttention's backward is 5/2 of it
        attention = 4 * b * a * s * s * d // 2 // cp
        attention_f = attention / rates.attention_forward
        attention_b = attention * 5 // 2 / rates.attention_backward
    else:                        # batched GEMMs over the whole s x s scores
        attention_f = 4 * b * a * s * s * d / rates.activations
        attention_b = 8 * b * a * s * s * d / rates.activations
    dense = _mlp_flops(m, n, f)
    # GEMMs of a dense layer (False) and of a MoE layer (True), timed; the backward's dgrad and
    # wgrad are twice each GEMM's forward
    linear = {False: (attention_linear + dense) / rates.linear,
              True: attention_linear / rates.linear + _moe_forward_s(spec, n, rates)}
    forward = {kind: linear[kind] + attention_f for kind in linear}
    backward = {kind: 2 * linear[kind] + attention_b for kind in linear}
    head = 6 * n * h * (m.padded_vocab(tp) // tp) / rates.activations   # the output layer: bf16
    full = t.recompute == "full"

    def chunk(stage: int, index: int) -> float:
        """One micro-batch's forward and backward (and recomputed forward) of a stage's chunk."""
        layers = spec.chunk_layers(stage, index)
        recomputed = layers[:t.recompute_layers or len(layers)] if full else []
        extra = head if (stage, index) == (p.pp - 1, spec.vp - 1) else 0.0
        moe = sum(map(m.is_moe_layer, layers))
        moe_recomputed = sum(map(m.is_moe_layer, recomputed))
        # dense layers first: a dense model's sum is what it was before experts (0 MoE layers add 0.0)
        return (len(layers) - moe) * (forward[False] + backward[False]) + moe * (forward[True] + backward[True]) \
            + ((len(recomputed) - moe_recomputed) * forward[False] + moe_recomputed * forward[True]) + extra

    micro = spec.microbatches
    best, fill = 0.0, 0.0
    for stage in range(p.pp):
        work = micro * sum(chunk(stage, index) for index in range(spec.vp))
        best = max(best, fill + work)
        fill += chunk(stage, 0)
    return best


def _mlp_flops(m: ModelSpec, tokens: int, ffn: int) -> int:
    """A (gated) MLP's forward GEMM FLOPs: fc1 to (2) ffn, fc2 back to hidden."""
    return 2 * tokens * (m.hidden * m.up_projections() * ffn + ffn * m.hidden)


def _moe_forward_s(spec: JobSpec, n: int, rates: "_Rates") -> float:
    """A MoE block's GEMMs in one forward (0 for a dense model), as jobs.moe builds them: the
    shared experts' TP MLP, the router's bf16 GEMM over the rank's sequence-parallel tokens and
    the grouped expert GEMMs over the routed copies the rank computes (expert_memory.routed_copies:
    etp x its own when balanced, each expert's share rounded up as the generator rounds it)."""
    m, p = spec.shape, spec.parallel
    if not m.moe:
        return 0.0
    tokens = n // p.tp if spec.sp else n                # the residual stream's tokens here
    shared = _mlp_flops(m, n, m.shared_ffn // p.tp)
    # the copies the experts compute, as the generator sizes its grouped GEMMs (skewed routing: the
    # hottest EP rank's, which every rank runs)
    routed_flops = _mlp_flops(m, routed_copies(spec), m.expert_ffn // p.expert_tp)
    return (shared + routed_flops) / rates.linear + 2 * tokens * m.hidden * (m.num_experts or 1) / rates.activations


class _Rates:
    """The highest FLOP/s the compute model times each kind of kernel at: what it says
    (ComputeModel.matmul_ceiling_flops, .attention_ceiling_flops), else the profile's dense peaks."""

    def __init__(self, profile: Profile, precision: str, compute: ComputeModel | None):
        peaks = {dtype: rate.value * 1e12 for dtype, rate in profile.gpu.peak_tflops.items()}
        act = "fp16" if precision == "fp16" else "bf16"   # kernels.py: activations, attention, output layer

        def matmul(dtype: str) -> float:
            said = None if compute is None else compute.matmul_ceiling_flops(dtype)
            # a type without a peak runs at another type's: the fastest bounds it
            return said if said is not None else peaks.get(dtype) or max(peaks.values())

        def attention(backward: bool) -> float:
            said = None if compute is None else compute.attention_ceiling_flops(act, backward)
            return said if said is not None else self.activations

        self.linear = matmul(precision)
        self.activations = matmul(act)
        self.attention_forward = attention(False)
        self.attention_backward = attention(True)
