"""The zero-bubble schedule's weight-gradient steps (`parallel.schedule: zb-h1`, interleaved with vp
chunks per stage; the order of the steps is schedule.pipeline_steps).

A backward is split as the zero-bubble authors' Megatron-LM splits it (sail-sg/zero-bubble-pipeline-
parallelism at 39f2c186a27580b7051eb51e0f651e1efd0a8170, megatron/core/tensor_parallel/layers.py,
LinearWithGradAccumulationAndAsyncCommunication.backward, and megatron/core/zbpp_utils.py,
WeightGradStore):
- B computes each linear layer's input gradient and keeps its weight gradient back
  (WeightGradStore.put of the output gradient, the saved input and the GEMM). The input
  gradient's TP reduce-scatter (all-reduce without sequence parallelism) is waited for in B, with
  no weight gradient left to run beside it.
- W (WeightGradStore.pop) runs one micro-batch's kept weight gradients in the order B met them:
  under sequence parallelism each first all-gathers the saved input shard, synchronously
  (pre_process with async_op=False), then adds its GEMM into the main gradient.
- Until its W runs a micro-batch keeps the inputs those GEMMs read and each linear layer's output
  gradient; with `tensors: true` the output gradients are listed too (saved by the input-gradient
  GEMM, read by the weight gradient), so a memory layer counts what the deferral costs.
The norms' weight gradients (in their backward kernels) and the embedding's stay in B.
"""

from __future__ import annotations

from typing import Callable

from chakra_core.jobs.moe_overlap import CombinedSchedule, DelayedWgrad
from chakra_core.jobs.placement import Placement
from chakra_core.jobs.spec import JobSpec


class WeightPasses(CombinedSchedule):
    """Defers the linear layers' weight gradients of each micro-batch to its W step."""

    step_starts: list[int]   # program.RankProgram's

    def __init__(self, job: JobSpec, placement: Placement, rank: int):
        super().__init__(job, placement, rank)
        self._owed: dict[tuple[int, int], list[tuple[DelayedWgrad, bool]]] = {}   # (mb, chunk) -> (its W, in fp8)
        # a unit's model chunk: the embedding's is the first, the output layer's the last
        self._chunk_of: dict[int | str, int] = {"embedding": 0, "head": self.vp - 1}
        for chunk in range(self.vp):
            self._chunk_of.update(dict.fromkeys(job.chunk_layers(self.stage, chunk), chunk))

    def weight_gradient(self, name: str, dgrad: int, grad_elements: int, make: Callable[[], int]) -> int:
        if not self.zero_bubble:
            return make()
        key = self._layer_key
        grad_out = (*key, name + ".grad_out")
        self.ledger.save(dgrad, grad_out, grad_elements, self.act_bytes, output=False)
        wgrad = DelayedWgrad(make, name, key, [grad_out])
        self._owed.setdefault((key[0], self._chunk_of[key[1]]), []).append((wgrad, self.linear_fp8))
        token = -len(self._delayed) - 1     # `_read` adds what the GEMM reads to the stand-in's
        self._delayed[token] = wgrad
        return token

    def _weight_step(self, mb: int, chunk: int) -> None:
        """W: micro-batch `mb`'s weight gradients of a model chunk, in the order its B kept them."""
        self.step_starts.append(len(self.stream.nodes))
        self.part = "backward"
        for wgrad, fp8 in self._owed.pop((mb, chunk)):
            self._layer_key, self.linear_fp8 = wgrad.key, fp8
            self.ledger.use(wgrad.make(), *wgrad.reads)
        self.linear_fp8 = True
