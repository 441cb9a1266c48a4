"""fp8 parameters (`training.fp8_param_gather`, Megatron's --fp8-param-gather; every fp8 recipe of
Megatron-Bridge sets it: training/mixed_precision.py at v0.3.0), a mixin of the rank program.

Read at NVIDIA/Megatron-LM b0cc2706 (the Megatron-LM of Megatron-Bridge v0.3.0) and
NVIDIA/TransformerEngine 5671fd36 (v2.12, which Megatron-Bridge v0.3.0 pins):
- Transformer Engine creates the linear layers' weights as quantized tensors (transformer_config.py
  fp8_param; fp8_utils.get_fp8_context(is_init=True)): there is no 16-bit copy of them, and the
  forward uses them as they are (module/linear.py: a QuantizedTensor weight is not cast again).
  The other parameters (norms, embedding, output layer, router) stay bf16.
- Delayed and current scaling (Float8Tensor): the distributed optimizer keeps them in a uint8
  buffer of their own (distributed_data_parallel.py: param_dtype torch.uint8), so their all-gather
  moves 1 B per element beside the bf16 parameters' 2 B (a bucket group gathers both, coalesced;
  one collective here). After each gather TE makes each weight's transpose for the backward's GEMMs
  (tensor/utils.py post_all_gather_processing: _create_transpose where non-TN fp8 GEMMs are not
  supported, as on Hopper; Blackwell has no transpose: jobs/fp8.py fp8_transposes). With the
  distributed optimizer the transpose lives until the next step's gather; under
  Megatron-FSDP it is made after each backward gather and dropped after use
  (megatron_fsdp.py: fp8_create_transpose_cache at the pre-backward unshard,
  keep_fp8_transpose_cache False).
- The optimizer writes each fp8 weight's updated shard (quantize_param_shard ->
  cast_master_weights_to_fp8): current scaling takes the amax of each fp32 master shard
  (tex.compute_amax, a read of 4 B per element), all-reduces the packed amaxes (4 B per weight
  tensor) over the data-parallel group with MAX, computes the scales (one small kernel) and casts
  (read 4 B, write 1 B); delayed scaling casts with the scales it has, taking the amaxes on the
  way, and all-reduces them the same. The optimizer's own copy to 16-bit weights skips fp8 weights
  (distrib_optimizer.py _copy_main_params_to_model_params).
- MXFP8 (MXFP8Tensor): Megatron-Bridge's recipe sets reuse_grad_buf_for_mxfp8_param_ag, so the
  all-gather still moves bf16, through the gradient buffer (param_and_grad_buffer.py: param_data a
  bf16 view of the shared buffer), after which each weight is quantized as without fp8 parameters
  (once per step); only the bf16 weight buffer goes. Under Megatron-FSDP MXFP8 parameters also
  gather a columnwise copy for the backward (transpose_weight_buffer): not modelled, refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from chakra_core.jobs.primitives import KernelPrimitives
from chakra_core.schema import pb

if TYPE_CHECKING:
    from chakra_core.jobs.spec import JobSpec
    from chakra_core.jobs.tensors import TensorLedger

AMAX_BYTES = 4
"""An fp32 amax per fp8 weight tensor in the optimizer's all-reduce."""
MASTER_BYTES = 4
"""The fp32 master weight the optimizer casts from."""


def fp8_param_problems(job: JobSpec) -> list[str]:
    """What Megatron refuses of fp8 parameters (arguments.py, transformer_config.py at b0cc2706), and
    what is not modelled."""
    t = job.training
    if not t.fp8_param_gather:
        return []
    out = []
    if t.precision != "fp8":   # "fp8_param must be used together with fp8 mode."
        out.append(f"training.fp8_param_gather needs precision fp8 (it is {t.precision})")
    if not (t.distributed_optimizer or t.use_megatron_fsdp):
        out.append("training.fp8_param_gather needs the distributed optimizer or Megatron-FSDP (Megatron: "
                   "--fp8-param-gather only supported with distributed optimizer, torch fsdp2, megatron fsdp)")
    if t.precision == "fp8" and t.fp8_recipe == "mxfp8" and t.use_megatron_fsdp:
        out.append("training.fp8_param_gather with fp8_recipe mxfp8 under Megatron-FSDP (which gathers a "
                   "columnwise copy for the backward) is not modelled")
    return out


class Fp8Parameters(KernelPrimitives):
    """Sizes and kernels of fp8 parameters (see the module docstring)."""

    if TYPE_CHECKING:
        experts_here: int
        ledger: TensorLedger

        def linear_weights(self, layer: int) -> int:
            raise NotImplementedError

        def expert_params_here(self) -> int:
            raise NotImplementedError

    @property
    def fp8_primary(self) -> bool:
        """The linear weights are Float8Tensors (delayed or current scaling): gathered in fp8,
        transposed after their gather, written by the optimizer."""
        t = self.job.training
        return t.fp8_param_gather and t.precision == "fp8" and t.fp8_recipe != "mxfp8"

    def routed_linear(self, unit: int) -> int:
        """Elements of a unit's routed experts' weights on this rank (no biases)."""
        m = self.job.shape
        if unit < 0 or not m.is_moe_layer(unit):
            return 0
        return self.expert_params_here() - self.experts_here * m.mlp_biases(m.expert_ffn)

    def bucket_linear(self, units: Iterable[int], expert: bool = False) -> int:
        """Of the units' parameters in the dense (or, `expert`, the expert) buffer, the fp8 weights."""
        total = 0
        for unit in units:
            if unit >= 0:
                routed = self.routed_linear(unit)
                total += routed if expert else self.linear_weights(unit) - routed
        return total

    def shard_bytes(self, params: int, linear: int, shards: int) -> int:
        """Bytes of one rank's shard of `params` parameters (`linear` of them fp8 weights) that an
        all-gather over `shards` ranks sends."""
        if not self.fp8_primary:
            return -(-params // shards) * self.act_bytes
        return -(-linear // shards) + -(-(params - linear) // shards) * self.act_bytes

    def weight_buffer_bytes(self, params: int, linear: int) -> int:
        """Bytes of the weights of `params` parameters (`linear` of them fp8 weights) in the parameter
        buffer: fp8 weights at 1 B; MXFP8 parameters' bf16 gather goes through the gradient buffer."""
        if self.fp8_primary:
            return linear + (params - linear) * self.act_bytes
        mx = self.job.training.fp8_param_gather and self.fp8
        return (params - linear if mx else params) * self.act_bytes

    def weight_storage(self, params: int, linear: int) -> int:
        """The tensor ledger's storage of a bucket's weights (16-bit elements unless fp8 parameters)."""
        if not self.job.training.fp8_param_gather:
            return self.ledger.new(params, self.act_bytes)
        return self.ledger.new(self.weight_buffer_bytes(params, linear), 1)

    @property
    def fp8_weight_copies(self) -> int:
        """fp8 copies TE keeps of each linear weight besides the weight: the rowwise and the columnwise
        (transposed) one, one where fp8 GEMMs run in every layout; of fp8 parameters only the
        transpose, if any."""
        return self.quantized_copies - (1 if self.fp8_primary else 0)

    def weight_transpose(self, name: str, elements: int) -> None:
        """TE's transpose of gathered fp8 weights (post_all_gather_processing), where there is one."""
        if self.fp8_primary and self.fp8_on and self.fp8_transposed and elements:
            self.elementwise(name + ".transpose", elements, 2 * elements, dtype="fp8")

    def fp8_weight_tensors(self, units: list[int]) -> int:
        """Linear weight tensors of the units (the optimizer's packed amaxes): QKV and projection (MLA:
        five), fc1 and fc2, or a MoE layer's two per local expert and shared expert block, MTP's eh_proj."""
        m = self.job.shape
        count = 0
        for unit in units:
            if unit < 0:
                continue
            count += (5 if m.mla else 2) + (1 if unit >= m.layers else 0)
            count += 2 * self.experts_here + (2 if m.shared_ffn else 0) if m.is_moe_layer(unit) else 2
        return count

    def fp8_param_update(self, linear: int, tensors: int) -> None:
        """The optimizer writes the `linear` fp8 weight elements of its shards (`tensors` weights in
        all): amaxes (current scaling), their all-reduce over the data-parallel group, scales, cast."""
        if not (self.fp8_primary and self.fp8_on) or not tensors:
            return
        if self.job.training.fp8_recipe == "current":
            self.elementwise("optimizer.fp8_params.amax", linear, linear * MASTER_BYTES, dtype="fp32")
        self.blocking("optimizer.fp8_params.amax_all_reduce", "dp_cp", pb.ALL_REDUCE, tensors * AMAX_BYTES, "dp")
        if self.job.training.fp8_recipe == "current":
            self.elementwise("optimizer.fp8_params.scale", tensors, tensors * 3 * AMAX_BYTES, dtype="fp32")
        self.elementwise("optimizer.fp8_params.cast", linear, linear * (MASTER_BYTES + 1), dtype="fp32")
