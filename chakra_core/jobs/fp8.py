"""Transformer Engine's fp8 quantization around each fp8 GEMM: the kernels and reductions a layer
runs besides its GEMMs (a mixin of `kernels.LayerKernels`).

Read at NVIDIA/TransformerEngine d0067d0da6cb01811b8072a7d304f0e00344ce2b and NVIDIA/Megatron-LM
d98e8a64ddf34856e74b24714e3bedb2f5a39553:

- delayed scaling: a GEMM input is cast and transposed in one kernel (read bf16, write the fp8 copy
  and its transpose), with its amax taken on the way; LayerNormLinear's norm writes fp8 itself
  (normalization.cpp: FULLY_FUSED for fp8 quantizers). Megatron wraps the whole block in one
  fp8_autocast (transformer_block.py), at whose exit TE reduces every amax of the pass in one
  all-reduce (quantization.py reduce_and_update_fp8_tensors, over TP x DP x CP:
  get_amax_reduction_group) and updates the scales: once per forward and once per backward of a
  model chunk.
- current scaling (Float8CurrentScalingQuantizer::quantize_impl, quantizer.cpp): every quantized
  tensor first gets its own amax pass (a full read, after a one-thread kernel zeroing the amax:
  common/recipe/current_scaling.cu launch_amax_kernel), then its scale (a tiny kernel), then the cast;
  a sequence-parallel column-parallel input (forward) and a row-parallel layer's output gradient
  (backward) all-reduce that amax over TP first (linear.py: amax reduction group). Norms write bf16
  and their amax (FUSED_NORM_AMAX_FP8) and are quantized after.
- MXFP8 (MXFP8Quantizer::quantize, quantizer.cpp: one nvte_quantize_v2 call; cast/mxfp8/
  quantize_mxfp8.cuh): a scale (E8M0, one byte) per 32 elements, computed inside the one cast
  kernel that writes the rowwise and the columnwise copy of a tensor with their scales: no amax
  pass, no scale kernel, no amax reduction. Norms write bf16 and are quantized after (a fused norm
  with MXFP8 output needs cuDNN's norm, NVTE_NORM_FWD_USE_CUDNN, which Megatron-Bridge's MXFP8
  launchers unset). Not modelled: the scales' swizzle into cuBLAS's layout (a small kernel per
  operand where the cast does not write it swizzled), and the scales of the fp8 tensors a layer
  saves for its backward (1/32 more bytes than counted).
- NVFP4 (precision nvfp4; NVFP4Quantizer::quantize_impl, quantizer.cpp; recipe NVFP4BlockScaling):
  FP4 E2M1 with an E4M3 scale per 16 elements and an fp32 scale per tensor. Activations and
  gradients: an amax kernel (the tensor's, and its random Hadamard transform's for the columnwise
  copy: hadamard_transform.cu) whose TP all-reduce (both amaxes, 8 bytes) runs for a
  sequence-parallel column-parallel input and a row-parallel output gradient, then one kernel
  writing both FP4 copies with their scales (row_cast_col_hadamard_transform_cast_fusion.cu; the
  gradients stochastically rounded in it). Norms write bf16 and the quantizer takes its own amax
  (with the Hadamard transform the fused norm amax is not used: normalization.cpp). Weights (2D
  16x16 blocks, no transform): an amax and one cast, once per step. Every NVFP4 GEMM (fprop,
  dgrad, wgrad) first runs a one-thread kernel for its scale (cublaslt_gemm.cu
  compute_nvfp4_per_tensor_scale_kernel). Attention, embedding and output layer stay bf16; the
  sequence-parallel gathers move FP4 shards (tensor_parallel.py). Not modelled: scale swizzles,
  Megatron-Bridge's fp4 parameters (fp4_param_gather, from v0.4.2), and the saved fp8/fp4 inputs'
  true size (a byte per element is counted).
- a grouped linear (a mixture of experts' local experts) quantizes its input per expert
  (split_quantize, cast.cpp multi_tensor_quantize_impl at 5671fd36): one fused kernel for all of
  them under delayed scaling (nvte_multi_cast_transpose), and NVFP4's fused split kernel; under
  current scaling and MXFP8 each expert's quantizer runs its own kernels, which the host launches
  one by one (the nodes' `launches`).
- weights are quantized once per step (Megatron passes is_first_microbatch; with MXFP8 primary
  weights, once per step after the parameter all-gather).
- the transposed copy (delayed and current scaling) exists only where cuBLAS runs fp8 GEMMs in the
  TN layout alone (`fp8_transposes`): on Blackwell the quantizer writes the fp8 data only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from chakra_core.jobs.primitives import KernelPrimitives
from chakra_core.schema import pb

if TYPE_CHECKING:
    from chakra_core.jobs.spec import JobSpec, Training


AMAX_BYTES = 4 * 3 * 4
"""Per layer and pass: fp32 amaxes of the inputs, weights and outputs (or gradients) of its four
fp8 GEMMs (QKV, projection, FC1, FC2), reduced in one buffer."""


MX_BLOCK = 32
"""MXFP8: elements per E8M0 scale (one byte), along each direction a copy is quantized in."""
FP4_BLOCK = 16
"""NVFP4: elements per E4M3 scale (one byte)."""
QUANTIZED = ("fp8", "nvfp4")
"""Precisions whose linear layers Transformer Engine runs quantized."""


def fp8_transposes(architecture: str) -> bool:
    """Whether Transformer Engine keeps a transposed copy beside each delayed- or current-scaling fp8
    tensor a GEMM reads columnwise (the backward's dgrad and wgrad operands). Read at
    NVIDIA/TransformerEngine 5671fd36 (v2.12): quantizer.cpp Float8Quantizer::create_tensor and
    Float8CurrentScalingQuantizer::create_tensor, `with_transpose = columnwise_usage &&
    !nvte_is_non_tn_fp8_gemm_supported()` and `with_data = rowwise_usage ||
    nvte_is_non_tn_fp8_gemm_supported()`; transformer_engine.cpp: non-TN fp8 GEMMs from compute
    capability 10.0 below 12.0, and from 13.0 (the data centre Blackwell parts, sm100 and sm103:
    B200, GB200, GB300); tensor/utils.py post_all_gather_processing transposes gathered fp8
    parameters only without them. So on Blackwell one fp8 copy serves every GEMM; on Ampere and
    Hopper two do. MXFP8 and NVFP4 keep a rowwise and a columnwise copy on every GPU (their block
    scales run along one direction)."""
    return architecture != "blackwell"


def quantized_copies(dtype: str, transposed: bool) -> int:
    """Copies a quantizer writes (and keeps) of a tensor read rowwise and columnwise by `dtype` GEMMs:
    the data and its transpose (`transposed`: fp8_transposes), or one where fp8 GEMMs run in every
    layout; MXFP8 and NVFP4 two."""
    return 2 if dtype != "fp8" or transposed else 1


def gemm_dtype(training: Training) -> str:
    """The data type a job's GEMMs run in (a profile's peak and achievable rate): MXFP8 under the
    mxfp8 recipe, else the precision."""
    if training.precision == "fp8" and training.fp8_recipe == "mxfp8":
        return "mxfp8"
    return training.precision


def quantized_bytes(elements: int, dtype: str) -> int:
    """Bytes of one quantized copy of a tensor of `elements` in `dtype`, with its block scales."""
    if dtype == "nvfp4":
        return -(-elements // 2) + -(-elements // FP4_BLOCK)
    return elements + (-(-elements // MX_BLOCK) if dtype == "mxfp8" else 0)


def precision_problems(job: JobSpec) -> list[tuple[str, str]]:
    """(key, why) for what a quantized job asks that Transformer Engine does not run, or that is not
    modelled."""
    t, p = job.training, job.parallel
    out = []
    if t.precision == "nvfp4" and p.tp_comm_overlap and p.tp > 1:
        # module/base.py fill_userbuffers_buffer_for_all_gather: "Unsupported quantizer for Userbuffers";
        # Megatron-Bridge's NVFP4 launchers switch the overlap off
        out.append(("job.parallel.tp_comm_overlap", "Transformer Engine's userbuffers do not run NVFP4 tensors "
                                                    "(precision nvfp4): set tp_comm_overlap false"))
    if t.precision == "nvfp4" and job.shape.moe:
        out.append(("job.training.precision", "nvfp4 with a mixture of experts (grouped expert GEMMs in NVFP4) "
                                              "is not modelled; use fp8 or bf16"))
    return out


class Fp8Quantization(KernelPrimitives):
    """The quantization kernels of fp8 GEMMs (see the module docstring)."""

    @property
    def fp8_on(self) -> bool:
        """fp8 GEMMs with Transformer Engine's overheads (job.effects.fp8_overheads)."""
        return self.fp8 and self.linear_fp8 and self.job.effects.fp8_overheads

    @property
    def current_scaling(self) -> bool:
        t = self.job.training
        return t.precision == "fp8" and t.fp8_recipe == "current"

    @property
    def delayed_scaling(self) -> bool:
        t = self.job.training
        return t.precision == "fp8" and t.fp8_recipe == "delayed"

    @property
    def fp4(self) -> bool:
        """NVFP4 (precision nvfp4)."""
        return self.job.training.precision == "nvfp4"

    @property
    def quantized_after_norm(self) -> bool:
        """A norm before a quantized GEMM writes bf16 and its output is quantized after it (current
        scaling, MXFP8, NVFP4), rather than fused into the norm (delayed scaling)."""
        return not self.delayed_scaling

    def quantize(self, name: str, elements: int, tp_amax: bool = False, amax_done: bool = False,
                 splits: int = 1) -> None:
        """Quantize a bf16 tensor to fp8 and its transpose before a GEMM reads it; `tp_amax`: its
        amax is all-reduced over TP first (current scaling); `amax_done`: a fused kernel (a norm)
        already took it; `splits`: a grouped linear's input, quantized per expert (split_quantize)."""
        if not self.fp8_on:
            return
        each = 1 if self.delayed_scaling or self.fp4 else splits   # their fused multi-tensor kernels
        if self.current_scaling or self.fp4:
            if not amax_done or self.fp4:     # NVFP4's quantizer takes its own amax, the norm's unused
                zeroed = 2 if self.current_scaling else 1   # zero_amax_kernel, then the amax kernel
                self.elementwise(name + ".amax", elements, elements * self.act_bytes, launches=zeroed * each)
            if tp_amax and "tp" in self.groups:
                self.blocking(name + ".amax_tp_all_reduce", "tp", pb.ALL_REDUCE, 8 if self.fp4 else 4, "tp")
            if self.current_scaling:
                self.elementwise(name + ".scale", each, 8 * each, dtype="fp32", launches=each)
        # reads bf16, writes the quantized copies (block-scaled ones with their scales)
        self.elementwise(name + (".cast_fp4" if self.fp4 else ".cast_fp8"), elements,
                         elements * self.act_bytes + self.quantized_copies * quantized_bytes(elements, self.gemm_dtype),
                         launches=each)

    @property
    def quantized_copies(self) -> int:
        """Copies a quantizer writes of a tensor read rowwise and columnwise (quantized_copies)."""
        return quantized_copies(self.gemm_dtype, self.fp8_transposed)

    def norm_output_bytes(self) -> int:
        """Bytes per element a norm writes before an fp8 GEMM: its fp8 output besides the bf16 one
        under delayed scaling (fused), bf16 only when quantized after it."""
        return self.act_bytes + (1 if self.fp8 and self.linear_fp8 and not self.quantized_after_norm else 0)

    def amax_reduction(self, name: str, layers: int) -> None:
        """Delayed scaling: the amaxes of a pass of a chunk's layers, reduced at the fp8_autocast exit."""
        if self.delayed_scaling and self.job.effects.fp8_overheads and layers:
            self.blocking(name + ".amax_all_reduce", "amax", pb.ALL_REDUCE, AMAX_BYTES * layers, "other")
