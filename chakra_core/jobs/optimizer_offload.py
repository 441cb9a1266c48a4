"""Optimizer-state offload to host memory: Megatron-Core's HybridDeviceOptimizer, as
`--optimizer-cpu-offload --optimizer-offload-fraction f` runs it (training.optimizer_offload_fraction).

Megatron-LM at d98e8a64, megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py and
optimizer/__init__.py (CPUAdam is torch.optim.AdamW with fused=True, param_update_in_fp32=True):
- the first f of the parameters this rank updates (whole tensors, in order, until f of the elements)
  keep their fp32 master weight and Adam moments in pinned host memory and are stepped by the CPU;
- their fp32 main gradients are copied to the host (D2H), the CPU steps them once the copies are
  done, and the updated fp32 weights are copied back into the model's weights (H2D); PyTorch's
  non-blocking copies convert types on the GPU (aten/src/ATen/native/cuda/Copy.cu
  copy_kernel_cuda), so both copies move 4 B per element;
- without `overlap_cpu_optimizer_d2h_h2d` both copies run on the compute stream (D2H, then the GPU's
  own Adam over the rest, then H2D after the CPU's step) and the CPU steps all its tensors in one
  call; with it every offloaded tensor has an optimizer of its own, the D2H copies run on a stream
  of their own, each tensor's CPU step starts when its copy is done, and its H2D copy (on a third
  stream, after the compute stream's work) as soon as its step ends; the compute stream waits for
  them all.
The CPU's step is a CPU node (`is_cpu_op`) of the time the profile's host gives
(`node.host_adam_ns_per_param` per element, `node.host_optimizer_call_us` per optimizer call);
the copies are MEM_STORE / MEM_LOAD nodes (`mem_location: remote`) timed by the job's memory
layer, as activation offload's are (jobs/offload.py offload_memory_defaults). Pieces here are
the offloaded elements split evenly over the rank's offloaded parameter tensors (counted from
the model's shape, `offload_pieces`: an estimate, not Megatron's list, which also decides which
tensors come first).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from chakra_core.errors import ManifestError
from chakra_core.et.build import bool_attr, micros_from_ns, str_attr, uint_attr
from chakra_core.schema import pb

if TYPE_CHECKING:
    from chakra_core.et.build import Stream
    from chakra_core.hardware.profiles import Profile
    from chakra_core.jobs.placement import Placement
    from chakra_core.jobs.spec import JobSpec

COPY_BYTES = 4
"""fp32 main gradient to the host, fp32 master weight back (converted to the model's type on the GPU)."""


@dataclass(frozen=True)
class HostOptimizer:
    """What the host's CPU Adam costs (the profile's node section)."""

    ns_per_param: float
    call_us: float


def host_optimizer(job: JobSpec, profile: Profile, source: str) -> HostOptimizer | None:
    """The profile's host rates; a job that offloads its optimizer to a profile without them is refused."""
    node = profile.node
    if node.host_adam_ns_per_param is None or node.host_optimizer_call_us is None:
        if job.training.optimizer_offload_fraction:
            raise ManifestError([(f"{source}: job.training.optimizer_offload_fraction", (
                f"profile '{profile.name}' does not say what its host's CPU Adam costs: give "
                "node.host_adam_ns_per_param and node.host_optimizer_call_us, with their sources (docs/hardware.md)"))])
        return None
    return HostOptimizer(float(node.host_adam_ns_per_param.value), float(node.host_optimizer_call_us.value))


def optimizer_offload_problems(job: JobSpec) -> list[str]:
    """What Megatron-Core refuses with optimizer CPU offload, and what is not modelled with it."""
    t = job.training
    if not t.optimizer_offload_fraction:   # overlap_cpu_optimizer_d2h_h2d alone changes nothing, as in Megatron
        return []
    out = []
    if not t.distributed_optimizer:   # Megatron-Bridge docs/training/cpu-offloading.md: "Required"
        out.append("training.optimizer_offload_fraction needs distributed_optimizer (Megatron's HybridDeviceOptimizer "
                   "runs inside the distributed optimizer)")
    if t.use_megatron_fsdp:
        out.append("training.optimizer_offload_fraction with use_megatron_fsdp is not modelled")
    if t.fp8_param_gather and t.fp8_recipe != "delayed":   # megatron/training/arguments.py at d98e8a64
        out.append("training.optimizer_offload_fraction with fp8_param_gather needs fp8_recipe delayed (Megatron)")
    return out


class OptimizerOffload:
    """Emits the host's share of the optimizer step (module docstring); a mixin of the rank program."""

    job: JobSpec
    stream: Stream
    place: Placement
    groups: dict[str, tuple[int, ...]]

    def offloaded_elements(self, updated: int) -> int:
        return round(self.job.training.optimizer_offload_fraction * updated)

    def offload_pieces(self, weight_tensors: int, offloaded: int, updated: int) -> int:
        """The offloaded parameter tensors: the stage's `weight_tensors` and, per layer, Megatron-Core's
        two norm weights (fused into linear_qkv and linear_fc1, or a MoE layer's pre-MLP norm), QK norms,
        four biases with add_bias_linear and a MoE router, plus the embedding or the final norm and output
        layer; a shard's share of them with the distributed optimizer (one more split by its ends), in
        the offloaded share."""
        m, p = self.job.shape, self.job.parallel
        per_layer = 2 + (2 if m.qk_layernorm else 0) + (4 if m.bias else 0) + (1 if m.moe else 0)
        tensors = weight_tensors + per_layer * -(-m.layers // p.pp) + 2
        return max(1, round((-(-tensors // len(self.groups.get("dp_cp", (0,)))) + 1) * offloaded / updated))

    def copy_grads_out(self, elements: int, pieces: int) -> list[int]:
        """The D2H copies of the offloaded main gradients: one on the compute stream, or one per
        piece on a stream of their own after the compute stream's work."""
        if not self.job.training.overlap_cpu_optimizer_d2h_h2d:
            return [self.stream.step(pb.MEM_STORE_NODE, "optimizer.offload.grads_d2h",
                                     attrs=_copy_attrs(elements * COPY_BYTES))]
        copies: list[int] = []
        for i, size in enumerate(_split(elements, pieces)):
            after = [*self.stream.frontier, *copies[-1:]]
            copies.append(self.stream.launch(pb.MEM_STORE_NODE, f"optimizer.offload.grads_d2h.{i}", after=after,
                                             attrs=_copy_attrs(size * COPY_BYTES)))
        return copies

    def step_on_host(self, elements: int, pieces: int, copies: list[int]) -> int:
        """The CPU's Adam steps and the H2D copies of their weights, after the GPU's own Adam (the
        stream's frontier); the compute stream then waits for the copies (the last returned)."""
        host = self.place.host_optimizer
        if host is None:   # jobs/expand.py refuses such a job before building it
            raise ValueError("optimizer offload needs the profile's node.host_adam_ns_per_param and "
                             "node.host_optimizer_call_us")
        overlap = self.job.training.overlap_cpu_optimizer_d2h_h2d
        sizes = _split(elements, pieces) if overlap else [elements]
        steps: list[int] = []
        loads: list[int] = []
        gpu_done = list(self.stream.frontier)
        for i, (size, copy) in enumerate(zip(sizes, copies)):
            ns = size * host.ns_per_param + host.call_us * 1000   # one optimizer call per piece
            steps.append(self.stream.launch(pb.COMP_NODE, f"optimizer.offload.cpu_adam.{i}", after=[copy, *steps[-1:]],
                                            duration_micros=micros_from_ns(round(ns)),
                                            attrs=[bool_attr("is_cpu_op", True), uint_attr("num_params", size),
                                                   str_attr("step_part", "optimizer")]))
            loads.append(self.stream.launch(pb.MEM_LOAD_NODE, f"optimizer.offload.params_h2d.{i}",
                                            after=[*gpu_done, steps[-1], *loads[-1:]],
                                            attrs=_copy_attrs(size * COPY_BYTES)))
        self.stream.wait(*loads)
        return loads[-1]


def _copy_attrs(size: int) -> list[pb.AttributeProto]:
    return [uint_attr("tensor_size", size), str_attr("mem_location", "remote"), str_attr("step_part", "optimizer")]


def _split(elements: int, pieces: int) -> list[int]:
    """`elements` in `pieces` near-equal parts (none empty)."""
    pieces = max(1, min(pieces, elements))
    base, extra = divmod(elements, pieces)
    return [base + (1 if i < extra else 0) for i in range(pieces)]
