"""How much of a GPU `chakra-sim plan` lets a layout's predicted peak use (docs/plan.md).

The predicted peak (`memory.predict_memory`) is what PyTorch's allocator holds for the model,
its optimizer and its activations. A layout fits when that peak and a reserve fit in the memory
a program can use:

- usable memory: the device total CUDA reports, `gpu.usable_memory_gib` (nvidia-smi's total less
  what the driver reserves; docs/hardware.md). A profile without it, or one that inherits it
  although it changed `memory_gib`, has `memory_gib` counted instead, with a warning.
- the reserve, per layout:
  - the CUDA context: CUDA_CONTEXT_BYTES;
  - the communication library's buffers: what the job's system layer says one communicator holds
    (`SystemLayer.communicator_memory_bytes`; the `nccl` layer: NCCL's buffers per channel of the
    profile's `nccl.channels`) for each communicator the layout's GPU uses (`communicators`);
  - the allocator's fragmentation: FRAGMENTATION of the predicted peak.
  `--headroom GIB` gives one reserve for every layout instead (0: none).
The predictions themselves are unchanged: only the limit they are held against moves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from chakra_core.contract.layers import SystemLayer
from chakra_core.errors import ManifestError
from chakra_core.hardware.profiles import Profile
from chakra_core.jobs.expand import with_cluster_defaults
from chakra_core.plan.layouts import Layout
from chakra_core.plugins import PluginHost
from chakra_core.json_types import JsonObject

GIB = 1 << 30
MB = 10**6

CUDA_CONTEXT_BYTES = 400 * MB
"""The CUDA context PyTorch creates on a GPU: "around 400MB if CUDA >= 11.7 is used and lazy module
loading enabled (default in PyTorch)" (ptrblck, NVIDIA, in https://github.com/pytorch/pytorch/issues/109888);
pytorch/pytorch pull request 86509 measured 287 MB lazy and 667 MB eager (cudaMemGetInfo). Kernels
loaded later (cuBLAS, cuDNN, Transformer Engine) grow it; no public per-job figure was found."""

FRAGMENTATION = 0.01
"""Memory the allocator cannot hand out at the limit, as a fraction of the peak. PyTorch's caching
allocator frees its cached free segments and retries before it fails (c10/cuda/CUDACachingAllocator.cpp);
what is left is stranded inside segments in use. Public out-of-memory reports of training runs give
it: 393.78 MiB beside 43.68 GiB allocated, 0.9% (https://github.com/mila-iqia/milabench/pull/315),
79.61 MiB beside 43.89 GiB, 0.2% (https://github.com/huggingface/sentence-transformers/issues/3214);
the larger, rounded up. What a run holds below the limit is more (Megatron-LM logs: max reserved 13%
above max allocated, https://github.com/NVIDIA/Megatron-LM/issues/756), but that is released first."""


def communicators(layout: Layout) -> int:
    """NCCL communicators one GPU of the layout uses: Megatron-LM's tensor-, context-, data-parallel
    (with CP, the DP x CP group the gradients are reduced over) and pipeline groups larger than one GPU;
    a mixture of experts' layout adds the expert tensor-, expert- and expert-data-parallel groups
    (megatron/core/parallel_state.py: its own process groups, even where they hold the same ranks)."""
    experts = (layout.etp or 1, layout.ep, layout.edp) if layout.moe else ()
    return sum(size > 1 for size in (layout.tp, layout.cp, layout.dp * layout.cp, layout.pp, *experts))


@dataclass(frozen=True)
class Reserve:
    """Memory a layout needs on a GPU beside its predicted peak, bytes."""

    cuda_context: int = 0
    nccl: int = 0
    fragmentation: int = 0
    given: int | None = None
    """--headroom: the reserve of every layout, in place of the parts."""

    @property
    def total(self) -> int:
        return self.given if self.given is not None else self.cuda_context + self.nccl + self.fragmentation


@dataclass(frozen=True)
class Headroom:
    """The usable memory of a profile's GPU and how a layout's reserve is worked out."""

    usable: int
    """Bytes a program can allocate per GPU."""
    usable_from: str
    """Which profile key gave it, and why."""
    gpu_memory: int
    """The datasheet's memory (gpu.memory_gib), bytes."""
    nccl_per_communicator: int
    """What the system layer holds per communicator on each GPU (NCCL's buffers), bytes."""
    given: int | None = None
    warnings: tuple[str, ...] = ()
    moe: bool = False
    """The layouts are a mixture of experts': their expert groups are communicators too."""

    @classmethod
    def of(cls, profile: Profile, headroom_gib: float | None = None, per_communicator: int = 0,
           moe: bool = False) -> "Headroom":
        """`per_communicator`: bytes the system layer holds per communicator (communicator_bytes);
        `moe`: the job is a mixture of experts."""
        gpu = profile.gpu
        memory = int(gpu.memory_gib.value * GIB)
        stale = profile.inherited("gpu.usable_memory_gib")
        warnings: list[str] = []
        if gpu.usable_memory_gib is not None and not stale:
            usable, usable_from = int(gpu.usable_memory_gib.value * GIB), "gpu.usable_memory_gib"
        else:
            usable = memory
            why = (f"{stale[0].message()}; the plan counts gpu.memory_gib instead" if stale else
                   f"profile '{profile.name}' gives no gpu.usable_memory_gib (what CUDA reports); the plan counts "
                   "gpu.memory_gib, of which the driver keeps some")
            usable_from = f"gpu.memory_gib ({why})"
            warnings.append(f"memory: {why}")
        given = None
        if headroom_gib is not None:
            if not (math.isfinite(headroom_gib) and 0 <= headroom_gib * GIB < usable):
                raise ManifestError([("--headroom", f"{headroom_gib:g} GiB: give a reserve of at least 0 and below "
                                                    f"the {usable / GIB:.2f} GiB a GPU can use")])
            given = int(headroom_gib * GIB)
        return cls(usable, usable_from, memory, per_communicator, given, tuple(warnings), moe)

    def reserve(self, layout: Layout, peak: int) -> Reserve:
        """The reserve of `layout` whose predicted peak is `peak` bytes."""
        if self.given is not None:
            return Reserve(given=self.given)
        return Reserve(cuda_context=CUDA_CONTEXT_BYTES, nccl=communicators(layout) * self.nccl_per_communicator,
                       fragmentation=math.ceil(FRAGMENTATION * peak))

    @property
    def expert_groups(self) -> str:
        return ", ETP, EP, EDP" if self.moe else ""

    def describe(self) -> str:
        """One line: the usable memory and the reserve rule."""
        where = f"{self.usable / GIB:.2f} GiB usable per GPU ({self.usable_from.split(' (')[0]})"
        if self.given is not None:
            return f"a layout fits when its predicted peak and a reserve of {self.given / GIB:.2f} GiB (--headroom) " \
                   f"fit in {where}"
        return (f"a layout fits when its predicted peak and its reserve fit in {where}; reserve: CUDA context "
                f"{CUDA_CONTEXT_BYTES / GIB:.2f} GiB + NCCL {self.nccl_per_communicator / GIB:.2f} GiB per "
                f"communicator (TP, CP, DP, PP{self.expert_groups} groups of more than one GPU) + "
                f"{100 * FRAGMENTATION:g}% of the "
                "peak for fragmentation (--headroom GIB sets one reserve for all)")

    def summary(self) -> JsonObject:
        """For plan.json."""
        return {"gpu_memory_gib": self.gpu_memory / GIB, "usable_memory_gib": self.usable / GIB,
                "usable_memory_from": self.usable_from,
                "reserve": ({"given_gib": self.given / GIB} if self.given is not None else
                            {"cuda_context_gib": CUDA_CONTEXT_BYTES / GIB,
                             "nccl_per_communicator_gib": self.nccl_per_communicator / GIB,
                             "fragmentation_of_peak": FRAGMENTATION})}


def communicator_bytes(manifest: Mapping[str, Any], base_dir: Path, host: PluginHost, profile: str,
                       gpus_per_node: int) -> int:
    """What one communicator of the job's system layer holds on each GPU (0 without one), its
    config filled with the cluster's profile and GPUs per node as a job's would be."""
    section = dict(manifest.get("system") or {})
    name = section.pop("plugin", None)
    if not isinstance(name, str):
        return 0
    cls = host.get("system", name).cls
    if not issubclass(cls, SystemLayer):
        return 0
    defaults = {"profile": profile, "gpus-per-node": gpus_per_node}
    config = cls.Config.model_validate(with_cluster_defaults(cls.Config, section, defaults))
    return cls.communicator_memory_bytes(config, base_dir)
