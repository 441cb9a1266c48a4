"""When the distributed optimizer's parameter all-gathers start (`training.overlap_param_gather`):
bucket by bucket beside the forward, each bucket waited for before its first forward.

Megatron-Core has dispatched the first bucket in two ways:

- `first_forward` (Megatron-Core 0.9 and later; NVIDIA/Megatron-LM at d98e8a64,
  distributed/param_and_grad_buffer.py finish_param_sync: "If current bucket's param AG has not
  been dispatched, dispatch it now"): without interleaving, a chunk's first bucket starts at its
  first forward, so a later pipeline stage, one bucket (bucketing is off there), waits for its
  whole all-gather after its first activation arrives; with interleaving (align_param_gather,
  Megatron-LM's default there) every bucket of chunks 0 and 1 starts at the step's start and those
  of chunk c when chunk c - 1 starts (pipeline_parallel/schedules.py, param_sync_func).
- `step_start` (before Megatron-Core 0.9: the distributed optimizer's zero_grad in core_v0.4.0
  to core_v0.8.0, megatron/optimizer/ then megatron/core/optimizer/distrib_optimizer.py:
  "launch all-gather for first accessed bucket here before forward compute is initiated"): the
  first bucket in forward order starts when the step zeroes its gradients, on every stage, so a
  later stage's all-gather runs while it waits for its first activation. Modelled without
  interleaving (those releases chained every chunk's buckets in one sequence).

In both, each next bucket starts when the one before is waited for (the forward pre-hook).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chakra_core.jobs.fp8_params import Fp8Parameters
from chakra_core.schema import pb

if TYPE_CHECKING:
    from chakra_core.jobs.spec import JobSpec

Key = tuple[bool, int]   # a parameter bucket: (in the expert buffer, its first unit in forward order)


def param_gather_problems(job: JobSpec) -> list[str]:
    t = job.training
    if t.param_gather_start == "first_forward":
        return []
    if t.use_megatron_fsdp or not (t.distributed_optimizer and t.overlap_param_gather):
        return ["training.param_gather_start: step_start needs the distributed optimizer with overlap_param_gather "
                "(and not Megatron-FSDP, which gathers on its own schedule)"]
    if job.vp > 1:
        return ["training.param_gather_start: step_start is modelled without interleaving (vp 1): Megatron-Core "
                "0.8 chained the buckets of every model chunk, which is not modelled"]
    return []


class ParamGathers(Fp8Parameters):
    """Plans, launches and waits for the parameter all-gathers (see the module docstring)."""

    if TYPE_CHECKING:
        vp: int   # chunks per stage (kernels.LayerKernels)

        def _dp_collective(self, name: str, role: str, kind: int, size: int,
                           after: list[int] | None = None) -> int | None:
            raise NotImplementedError

        def _by_chunk(self, buckets: list[tuple[list[int], int]]) -> list[list[tuple[list[int], int]]]:
            raise NotImplementedError

    def __init__(self, job: JobSpec, *args: object) -> None:
        super().__init__(job, *args)  # type: ignore[call-arg]  # the program's other bases
        # keyed by (expert buffer?, a bucket's first unit): dense and expert parameters are gathered
        # over their own groups (Megatron-Core's expert_parallel_buffers)
        self.param_gather: dict[Key, int | None] = {}     # -> its all-gather, launched
        self.gather_size: dict[Key, int] = {}             # -> its parameters
        self.gather_linear: dict[Key, int] = {}           # -> of those, the fp8 weights (fp8_params.py)
        self.gather_next: dict[Key, Key] = {}             # -> the next bucket's, launched beside it
        self.gather_with: dict[int, list[Key]] = {}       # chunk -> buckets launched at its first forward
        self.gather_first: list[Key] = []                 # each buffer's first bucket in forward order

    def _plan_param_gathers(self, buckets: list[tuple[list[int], int]], expert: bool = False) -> None:
        """When each bucket's all-gather starts (the module docstring): launched now, at a chunk's
        first forward, beside the bucket before, or (`gather_first`) at the step's start."""
        for chunk, chunk_buckets in enumerate(self._by_chunk(buckets)):
            forward = [(expert, units[-1]) for units, _ in reversed(chunk_buckets)]   # first units, forward order
            for units, size in chunk_buckets:
                self.gather_size[expert, units[-1]] = size
                self.gather_linear[expert, units[-1]] = self.bucket_linear(units, expert)
            if self.vp == 1:
                self.gather_next.update(zip(forward, forward[1:]))
                self.gather_first.extend(forward[:1])
            elif chunk < 2:
                for key in forward:
                    self.param_gather[key] = self._gather_params(key)
            else:
                self.gather_with.setdefault(chunk - 1, []).extend(forward)

    def start_param_gathers(self) -> None:
        """At the step's start (after the gradient buffers are zeroed): `step_start` launches each
        buffer's first bucket."""
        if self.job.training.param_gather_start == "step_start":
            for key in self.gather_first:
                self.param_gather[key] = self._gather_params(key)

    def _await_params(self, layer: int) -> None:
        """Before a bucket's first forward, wait for its parameters (launched now if nothing
        launched them) and launch the next bucket's beside this one's forward."""
        for key in ((False, layer), (True, layer)):
            if key not in self.gather_size:
                continue
            node = self.param_gather.pop(key) if key in self.param_gather else self._gather_params(key)
            del self.gather_size[key]
            self.stream.wait(node)
            following = self.gather_next.pop(key, None)
            if following is not None:
                self.param_gather[following] = self._gather_params(following)

    def _gather_params(self, key: Key) -> int | None:
        expert, unit = key
        role, what = ("edp", "edp") if expert else ("dp_cp", "dp")
        return self._dp_collective(f"params.{what}_all_gather.u{unit}", role, pb.ALL_GATHER,
                                   self.shard_bytes(self.gather_size[key], self.gather_linear[key], len(self.groups[role])))
