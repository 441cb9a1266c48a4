"""The routed experts' activation and its selective recomputation (a mixin of kernels.LayerKernels).

TEGroupedMLP (NVIDIA/Megatron-LM megatron/core/transformer/moe/experts.py at d98e8a64) runs the
activation between the grouped fc1 and fc2 with bias_activation_fusion, the routing probabilities
applied in it:
- a SwiGLU model: weighted_bias_swiglu_impl, one fused kernel (fused_bias_swiglu.py);
- GPT-OSS (`clamped-swiglu`: quick_gelu, glu_linear_offset 1, activation_func_clamp_value 7):
  weighted_bias_quick_geglu_impl (fused_bias_geglu.py) first clamps the gate half (at most 7) and
  the linear half (to +-7) and concatenates them, three PyTorch kernels, then one fused kernel
  computes y1 sigmoid(1.702 y1) (y2 + 1) x the probability (OpenAI's swiglu(x, alpha=1.702,
  limit=7.0)). It saves the clamped copy beside fc1's output (which the clamps' backward reads).
  The backward: the fused kernel's (quick_geglu_back and the probabilities' gradient), the two
  clamps' (gradient where the input was inside the limits) and chunk's (a cat of the halves).

`--recompute-modules moe_act` (recompute_modules; Megatron's output-discarding checkpoint,
tensor_parallel.CheckpointWithoutOutput) runs the activation under no_grad in the forward, keeping
only its input (fc1's output) and the probabilities, frees its output after fc2 has saved it,
and recomputes it (clamps included) when fc2's output gradient arrives, before fc2's backward.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from chakra_core.jobs.spec import JobSpec

SWIGLU_OPS, SWIGLU_BACKWARD_OPS = 5, 7
"""Per output element: silu, product, probability (forward); their derivatives (backward)."""
CLAMPED_OPS, CLAMPED_BACKWARD_OPS = 8, 20
"""Per output element of fused_bias_geglu.py's weighted quick GEGLU: 1.702 y1, its sigmoid (3),
y1 x, y2 + 1, product, probability (forward); quick_geglu_back's gradients of both halves and
the probability's, the sigmoid recomputed (backward)."""


class ExpertActivation:
    """The experts' activation kernels (see the module docstring)."""

    job: "JobSpec"
    act_bytes: int
    fp8: bool
    part: str

    if TYPE_CHECKING:   # provided by kernels.LayerKernels
        def elementwise(self, name: str, elements: int, nbytes: int, ops_per: int = 1, dtype: str = "bf16") -> int:
            raise NotImplementedError

        def _keep(self, node: int | None, what: str, elements: int, size: int, output: bool = True) -> None:
            raise NotImplementedError

        def _read(self, node: int | None, *what: str) -> None:
            raise NotImplementedError

    @property
    def clamped(self) -> bool:
        return self.job.shape.mlp == "clamped-swiglu"

    def expert_activation(self, p: str, received: int, up: int, ffn: int, recompute: bool = False) -> None:
        """The activation of `received` tokens (fc1's output of width `up`, `ffn` out), and what it
        keeps for the backward (nothing under moe_act recomputation but in the recompute)."""
        b = self.act_bytes
        keep = recompute or not self.job.training.recomputes("moe_act")
        if self.clamped:
            half = received * ffn
            self.elementwise(p + "moe.act_clamp_gate", half, 2 * half * b)
            self.elementwise(p + "moe.act_clamp_linear", half, 2 * half * b, 2)
            clamped = self.elementwise(p + "moe.act_clamp_cat", received * up, 2 * received * up * b)
            if keep:
                self._keep(clamped, "moe_clamped", received * up, b)
        act = self.elementwise(p + "moe.activation", received * ffn, (up + ffn) * received * b + received * b,
                               CLAMPED_OPS if self.clamped else SWIGLU_OPS)
        if keep:
            self._keep(act, "moe_act", received * ffn, 1 if self.fp8 else b)

    def expert_activation_recompute(self, p: str, received: int, up: int, ffn: int) -> None:
        """moe_act: the activation again before fc2's backward."""
        if self.job.training.recomputes("moe_act"):
            part, self.part = self.part, "recompute"
            self.expert_activation(p, received, up, ffn, recompute=True)
            self.part = part

    def expert_activation_backward(self, p: str, received: int, up: int, ffn: int) -> None:
        b = self.act_bytes
        node = self.elementwise(p + "moe.activation.bwd", received * ffn, (2 * up + ffn) * received * b,
                                CLAMPED_BACKWARD_OPS if self.clamped else SWIGLU_BACKWARD_OPS)
        if not self.clamped:
            self._read(node, "moe_fc1")
            return
        self._read(node, "moe_clamped")
        half = received * ffn
        self._read(self.elementwise(p + "moe.act_clamp_gate.bwd", half, 3 * half * b, 2), "moe_fc1")
        self._read(self.elementwise(p + "moe.act_clamp_linear.bwd", half, 3 * half * b, 3), "moe_fc1")
        self.elementwise(p + "moe.act_chunk.bwd", received * up, 2 * received * up * b)
