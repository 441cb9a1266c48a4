"""Activation offload to host memory: Transformer Engine's default CPU-offload schedule, as
Megatron-Core runs it with `--cpu-offloading-num-layers k` (training.cpu_offloading_num_layers).

Transformer Engine at 5671fd36 (v2.12, what Megatron-Bridge v0.3.0 pins),
transformer_engine/pytorch/cpu_offload.py, DefaultOffloadSynchronizer over the model's L layers:
- layers 0..k-1 are offloaded: every tensor such a layer saves for its backward with at least
  256 Ki elements (OffloadableLayerState._check_if_offload) is copied to pinned host memory;
- layer i's copies are queued when layer i+1's forward starts (fwd_step -> start_offload), on one
  offload stream that also carries the reloads, each after the event recorded when its tensor was
  saved: a tensor's copy can start as soon as the kernel that made it ends;
- the forward of layer L-k+i waits until layer i's copies are done (finish_offload_map: at most L-k
  layers' activations are on the GPU at any time);
- layer i's reload is queued when the backward of layer L-1-k+i starts (start_reload_map), tensor
  by tensor after the compute stream's work so far (wait_stream); the backward waits for a tensor's
  copy when it first reads it (pop_tensor).
Megatron-Core (transformer_config.py at b0cc2706) refuses it with pp > 1 and with recomputation,
and needs k < L; offloading weights does nothing in TE 2.12 (deprecated), so only activations are.
With `tensors: true` an offloaded tensor's GPU storage ends with its copy out, and its copy back
is a new storage the backward reads (jobs/tensors.py).

The copies are MEM_STORE_NODE / MEM_LOAD_NODE nodes with `mem_location: remote`, timed by the
job's memory layer, which it must name; one that takes ASTRA-sim's remote-memory keys gets host
memory as a per-GPU expansion at the profile's host link bandwidth unless the job says otherwise
(offload_memory_defaults). One copy node per tensor each way; the kernel that first reads a
reloaded tensor (the `_read` of jobs/kernels.py) waits for its copy.
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
Key = tuple[int, "int | str", str]
"""A saved tensor: (micro-batch, layer, what)."""


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
    t = job.training
    if not (t.cpu_offloading_num_layers or t.optimizer_offload_fraction):
        return {}
    key, what = (("cpu_offloading_num_layers", "activations") if t.cpu_offloading_num_layers else
                 ("optimizer_offload_fraction", "gradients and weights"))
    host = profile.node.host_link_gbps or profile.node.pcie_gbps   # what a GPU's copies to host memory cross
    if not isinstance(section, Mapping):
        link = (f"host memory per GPU at the profile's {host.value:g} GB/s host link" if host is not None
                else f"nothing: profile '{profile.name}' gives no host link (node.host_link_gbps, node.pcie_gbps)")
        raise ManifestError([(f"{source}: memory", f"required: job.training.{key} copies {what} with memory nodes, "
                              "so the job names its memory layer (`plugin:`; chakra-sim plugins lists them; "
                              f"docs/training.md, offload); one taking ASTRA-sim's remote-memory keys gets {link}")])
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
        # (mb, layer) -> its tensors copied out, in the order they were saved, and each one's copy
        self._stored: dict[tuple[int, int], list[tuple[Key, int, int]]] = {}
        self._reloaded: dict[Key, int] = {}             # a tensor -> its copy back, until a kernel reads it

    def tensor_saved(self, node: int | None, key: Key, elements: int, element_size: int) -> None:
        mb, layer, what = key
        if node is None or not isinstance(layer, int) or layer >= self.offloaded_layers or self.part != "forward":
            return
        if elements >= OFFLOAD_MIN_ELEMENTS:   # its copy waits for the kernel that made it (start_offload)
            size = elements * element_size
            store = self._copy(pb.MEM_STORE_NODE, f"mb{mb}.L{layer}.{what}.offload", size, [node])
            self._stored.setdefault((mb, layer), []).append((key, size, store))
            self.ledger.move_out(store, key)

    def tensor_read(self, node: int | None, keys: list[Key]) -> None:
        for key in keys:   # pop_tensor: the kernel that first reads a reloaded tensor waits for its copy
            load = self._reloaded.pop(key, None)
            if load is not None and node is not None and load not in self.stream.nodes[node].data_deps:
                self.stream.nodes[node].data_deps.append(load)

    def layer_forward(self, mb: int, layer: int) -> None:
        k = self.offloaded_layers
        released = layer - (self.job.shape.layers - k)    # finish_offload_map
        if k and 0 <= released < k and self._stored.get((mb, released)):
            stored = self._stored[mb, released]
            # its GPU copies are freed here (release_activation_forward_gpu_memory): after they are
            # done and the work queued since (not what the stream still waits for from an earlier
            # micro-batch)
            first = stored[0][2]
            self.ledger.hold([node for node in self.stream.frontier if node > first], [key for key, _, _ in stored])
            self.stream.wait(stored[-1][2])   # the offload stream's copies run in turn
        super().layer_forward(mb, layer)  # type: ignore[misc]

    def layer_backward(self, mb: int, layer: int, ready: bool = True) -> None:
        k = self.offloaded_layers
        reloaded = layer - (self.job.shape.layers - 1 - k)   # start_reload_map
        if k and 0 <= reloaded < k:   # after the compute so far (wait_stream), in the order they were saved
            frontier = list(self.stream.frontier)
            for key, size, _ in self._stored.pop((mb, reloaded), []):
                load = self._copy(pb.MEM_LOAD_NODE, f"mb{mb}.L{reloaded}.{key[2]}.reload", size, frontier)
                self._reloaded[key] = load
                self.ledger.move_in(load, key)
        super().layer_backward(mb, layer, ready)  # type: ignore[misc]

    def _copy(self, node_type: pb.NodeType, name: str, size: int, after: list[int]) -> int:
        """A copy on the offload stream, after `after` and the stream's last copy."""
        deps = [*after, *(() if self._offload_tail is None else (self._offload_tail,))]
        self._offload_tail = self.stream.launch(node_type, name, after=deps, attrs=[
            uint_attr("tensor_size", size), str_attr("mem_location", "remote"), str_attr("step_part", "offload")])
        return self._offload_tail
