"""Activation offload to host memory: Transformer Engine's default CPU-offload schedule, as
Megatron-Core runs it with `--cpu-offloading-num-layers k` (training.cpu_offloading_num_layers).

Transformer Engine at 5671fd36 (v2.12, what Megatron-Bridge v0.3.0 pins),
transformer_engine/pytorch/cpu_offload.py, DefaultOffloadSynchronizer over the model's L layers:
- layers 0..k-1 are offloaded: every tensor such a layer saves for its backward with at least
  256 Ki elements (OffloadableLayerState._check_if_offload) is copied to pinned host memory;
- layer i's copies are queued when layer i+1's forward starts (fwd_step -> start_offload), on one
  offload stream that also carries the reloads;
- the forward of layer L-k+i waits until layer i's copies are done (finish_offload_map: at most L-k
  layers' activations are on the GPU at any time);
- layer i's reload is queued when the backward of layer L-1-k+i starts (start_reload_map); it
  waits for the compute stream (wait_stream), and layer i's backward waits for it (pop_tensor).
Megatron-Core (transformer_config.py at b0cc2706) refuses it with pp > 1 and with recomputation,
and needs k < L; offloading weights does nothing in TE 2.12 (deprecated), so only activations are.
With `tensors: true` an offloaded tensor's GPU storage ends with its copy out, and its copy back
is a new storage the backward reads (jobs/tensors.py).

The copies are MEM_STORE_NODE / MEM_LOAD_NODE nodes with `mem_location: remote`, timed by the
job's memory layer, which it must name; one that takes ASTRA-sim's remote-memory keys gets host
memory as a per-GPU expansion at the profile's host link bandwidth unless the job says otherwise
(offload_memory_defaults). A layer's copies are one node each way: its first tensors could leave
a little before the layer ends, and its backward waits for all of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from chakra_core.errors import ManifestError
from chakra_core.et.build import str_attr, uint_attr
from chakra_core.json_types import JsonObject
from chakra_core.schema import pb

if TYPE_CHECKING:
    from chakra_core.et.build import Stream
    from chakra_core.hardware.profiles import Profile
    from chakra_core.jobs.spec import JobSpec
    from chakra_core.jobs.tensors import TensorLedger

OFFLOAD_MIN_ELEMENTS = 256 * 1024
"""Smaller saved tensors stay on the GPU (OffloadableLayerState._check_if_offload)."""


def offload_problems(job: JobSpec) -> list[str]:
    """What Megatron-Core refuses of CPU offloading, and what is not modelled with it."""
    k, t, p = job.training.cpu_offloading_num_layers, job.training, job.parallel
    if not k:
        return []
    out = []
    if k >= job.shape.layers:
        out.append(f"training.cpu_offloading_num_layers {k} must be less than the model's {job.shape.layers} layers "
                   "(Transformer Engine keeps the last on the GPU)")
    if p.pp > 1:
        out.append("training.cpu_offloading_num_layers needs pp 1 (Megatron-Core: no support for pipeline "
                   "parallelism with CPU offloading)")
    if t.recompute != "none":
        out.append("training.cpu_offloading_num_layers needs recompute none (Megatron-Core: CPU offloading does "
                   "not work when activation recomputation is enabled)")
    if p.overlap_moe_expert_parallel_comm:
        out.append("training.cpu_offloading_num_layers with parallel.overlap_moe_expert_parallel_comm is not modelled")
    if p.schedule != "1f1b":
        out.append(f"training.cpu_offloading_num_layers with parallel.schedule {p.schedule} is not modelled")
    if job.shape.mtp_layers:
        out.append("training.cpu_offloading_num_layers with multi-token prediction layers is not modelled")
    return out


def offload_memory_defaults(job: JobSpec, section: object, profile: Profile, source: str) -> JsonObject:
    """With offload, the job names its memory layer (the copies are memory nodes); that layer gets
    ASTRA-sim's remote-memory keys for host memory, one expansion per GPU at the profile's host
    link, where its config takes them and the job does not say (jobs/expand.py)."""
    if not job.training.cpu_offloading_num_layers:
        return {}
    host = profile.node.host_link_gbps or profile.node.pcie_gbps   # what a GPU's copies to host memory cross
    if not isinstance(section, Mapping):
        link = (f"host memory per GPU at the profile's {host.value:g} GB/s host link" if host is not None
                else f"nothing: profile '{profile.name}' gives no host link (node.host_link_gbps, node.pcie_gbps)")
        raise ManifestError([(f"{source}: memory", "required: job.training.cpu_offloading_num_layers copies activations "
                              "with memory nodes, so the job names its memory layer (`plugin:`; chakra-sim plugins lists "
                              f"them; docs/training.md, Activation offload); one taking ASTRA-sim's remote-memory keys gets {link}")])
    if host is None:
        return {}
    return {"memory-type": "PER_NPU_MEMORY_EXPANSION", "remote-mem-bw": host.value}


class ActivationOffload:
    """Copies the first k layers' saved activations to host memory and back (module docstring)."""

    job: JobSpec
    stream: Stream
    ledger: TensorLedger
    part: str

    def __init__(self, job: JobSpec, *args: object) -> None:
        super().__init__(job, *args)  # type: ignore[call-arg]  # the program's other bases
        self.offloaded_layers = job.training.cpu_offloading_num_layers
        self._offload_tail: int | None = None          # the offload stream's last copy
        self._saved_bytes: dict[tuple[int, int], int] = {}   # (mb, layer) -> bytes it offloads
        self._copies: dict[int, int] = {}               # layer -> its store (forward) or reload (backward)
        self._moved: dict[tuple[int, int], list[tuple[int, int, str]]] = {}   # (mb, layer) -> its listed tensors

    def count_saved(self, key: tuple[int, int | str], elements: int, element_size: int) -> None:
        """A layer saves a tensor for its backward (TE offloads it when large enough)."""
        mb, layer = key
        if isinstance(layer, int) and layer < self.offloaded_layers and elements >= OFFLOAD_MIN_ELEMENTS:
            self._saved_bytes[mb, layer] = self._saved_bytes.get((mb, layer), 0) + elements * element_size

    def layer_forward(self, mb: int, layer: int) -> None:
        k = self.offloaded_layers
        if not k:
            super().layer_forward(mb, layer)  # type: ignore[misc]
            return
        released = layer - (self.job.shape.layers - k)    # finish_offload_map
        if 0 <= released < k:
            # its GPU copy is freed here (release_activation_forward_gpu_memory): after the copy and the
            # work queued since it (not what the stream still waits for from an earlier micro-batch)
            store = self._copies.pop(released)
            self.ledger.hold([node for node in self.stream.frontier if node > store], self._moved.get((mb, released), []))
            self.stream.wait(store)
        super().layer_forward(mb, layer)  # type: ignore[misc]
        if layer < k:
            store = self._copies[layer] = self._copy(pb.MEM_STORE_NODE, f"mb{mb}.L{layer}.offload",
                                                     self._saved_bytes.get((mb, layer), 0))
            self._moved[mb, layer] = self.ledger.move_out(store, (mb, layer), OFFLOAD_MIN_ELEMENTS)

    def layer_backward(self, mb: int, layer: int, ready: bool = True) -> None:
        k = self.offloaded_layers
        if k:
            reloaded = layer - (self.job.shape.layers - 1 - k)   # start_reload_map
            if 0 <= reloaded < k:
                load = self._copies[reloaded] = self._copy(pb.MEM_LOAD_NODE, f"mb{mb}.L{reloaded}.reload",
                                                           self._saved_bytes.pop((mb, reloaded), 0))
                self.ledger.move_in(load, self._moved.pop((mb, reloaded), []))
            if layer < k:
                self.stream.wait(self._copies.pop(layer))
        super().layer_backward(mb, layer, ready)  # type: ignore[misc]

    def _copy(self, node_type: pb.NodeType, name: str, size: int) -> int:
        """A copy on the offload stream, after the compute stream's work so far and the stream's last copy."""
        after = [*self.stream.frontier, *(() if self._offload_tail is None else (self._offload_tail,))]
        self._offload_tail = self.stream.launch(node_type, name, after=after, attrs=[
            uint_attr("tensor_size", size), str_attr("mem_location", "remote"), str_attr("step_part", "offload")])
        return self._offload_tail
