"""The optimizer step of a rank's training step: gradient norm, Adam over the shard this rank
updates and, with fp8 parameters, the fp8 weights' update (a mixin of the rank program)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from chakra_core.jobs.fp8_params import Fp8Parameters
from chakra_core.jobs.optimizer_offload import OptimizerOffload
from chakra_core.schema import pb

ADAM_COPY_BYTES = 4 + 2
"""The copy of an updated fp32 master weight to the 16-bit model weight (read 4, write 2)."""
ADAM_BYTES_PER_PARAM = 4 * 2 * 3 + 4 + ADAM_COPY_BYTES
"""Adam step per parameter of the shard (Megatron-Core optimizer.py MixedPrecisionOptimizer.step
at d98e8a64): read and write the fp32 master weight and both moments, read the fp32 main
gradient (28 bytes), then copy the master weight to the 16-bit model weight."""
GRAD_COPY_BYTES = 2 + 4
"""16-bit main gradients are first copied to fp32 (distrib_optimizer.py _copy_model_grads_to_main_grads)."""
ADAM_OPS_PER_PARAM = 10
"""Two moment updates, bias corrections, sqrt, divide, weight decay, update."""


class AdamStep(Fp8Parameters, OptimizerOffload):
    """The optimizer step's kernels (see the module docstring)."""

    if TYPE_CHECKING:
        grad_bytes: int

    def _adam(self, updated: int, linear: int = 0, tensors: int = 0) -> int:
        """The optimizer step (returned) over the `updated` parameters this rank holds the state of;
        with fp8 parameters, `linear` of them fp8 weights (of `tensors` weight tensors), which the
        optimizer writes in fp8 after the step instead of copying them to 16 bits (fp8_params.py)."""
        self.part = "optimizer"
        if self.job.effects.step_overheads:
            # clip_grads.get_grad_norm_fp32: the squared norm of the (fp32) main gradients this
            # rank updates, then an all-reduce of one float (Megatron's over every rank of the
            # model and, with the distributed optimizer, its shards; here over dp x cp)
            self.elementwise("optimizer.grad_norm", updated, updated * 4, 2, dtype="fp32")
            self.blocking("optimizer.grad_norm_all_reduce", "dp_cp", pb.ALL_REDUCE, 4, "dp")
        if self.grad_bytes == 2:
            self.elementwise("optimizer.grads_to_fp32", updated, updated * GRAD_COPY_BYTES, dtype="fp32")
        fp8 = linear if self.fp8_primary and self.fp8_on else 0
        offloaded = self.offloaded_elements(updated)   # state and step on the host (optimizer_offload.py)
        if offloaded:
            pieces = self.offload_pieces(tensors, offloaded, updated)
            copies = self.copy_grads_out(offloaded, pieces)
            updated, fp8 = updated - offloaded, fp8 * (updated - offloaded) // updated
        step = self.elementwise("optimizer.adam", updated, updated * ADAM_BYTES_PER_PARAM - fp8 * ADAM_COPY_BYTES,
                                ADAM_OPS_PER_PARAM, dtype="fp32") if updated else -1
        if offloaded:
            last_copy = self.step_on_host(offloaded, pieces, copies)
            step = step if updated else last_copy
        self.fp8_param_update(linear, tensors)
        return step
