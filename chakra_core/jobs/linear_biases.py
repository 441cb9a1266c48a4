"""Linear-layer biases Megatron-Core adds outside Transformer Engine's GEMMs (a mixin of kernels.LayerKernels).

With add_bias_linear every linear layer has a bias (NVIDIA/Megatron-LM at d98e8a64). Transformer
Engine adds a bias in its GEMM's epilogue and reduces its gradient in the wgrad GEMM's epilogue
(bf16; in fp8 the output gradient's cast does it): no kernel of its own for the QKV projection
(TELayerNormColumnParallelLinear) and the experts' fc1 (GroupedLinear, skip_bias_add False;
TransformerEngine layernorm_linear.py and grouped_linear.py at d0067d0d), nor for the router's
forward (moe_utils.py RouterGatingLinearFunction: te_general_gemm with the bias).

A mixture of experts with biases runs three more as PyTorch operations of their own:
- the attention output projection's bias: TERowParallelLinear returns it (skip_bias_add) to the
  bias-dropout-add, which such a model runs unfused (TEGroupedMLP asserts "bias_dropout_fusion is
  not supported in TEGroupedMLP when add_bias_linear=True"; fused_bias_dropout.py
  _bias_dropout_add_func: x + bias, dropout at p = 0 (no kernel), residual + x): one add, and in
  the backward the bias gradient summed over the tokens;
- the experts' fc2 bias: GroupedLinear returns it (skip_bias_add True) and TEGroupedMLP._apply_bias
  adds it per local expert, weighted by the routing probabilities: t + b x p over torch.split of
  the tokens, then torch.cat (NVIDIA/Megatron-LM a329dd6d "Enable bias in expert mlp [gpt-oss
  5/5]"; experts.py at d98e8a64): a product and a sum per local expert, and a copy; the backward
  runs PyTorch's broadcasting mul backward per expert (grad x p summed over the tokens for the
  bias, grad x b summed over h for the probabilities), split's backward copies the token
  gradients together (a cat) and the probabilities' gradients are concatenated and added to
  those of the activation. Eager PyTorch launches the per-expert operations once per local expert;
  they are written here as one node per operation over all local experts (the same bytes), which
  leaves out the launches beyond the first: GPT-OSS 120B's step (16 local experts,
  docs/training.md) took 0.8% longer written with a node per expert and operation, in a trace 2.3
  times as long, simulated in 41 s instead of 30 s;
- the router bias's gradient: grad_output.sum(0) after the router's GEMMs.
A dense model's biases keep Megatron's default fused bias-dropout-add: the residual kernel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from chakra_core.jobs.spec import JobSpec


class LinearBiases:
    """The bias kernels of a mixture of experts with biases (see the module docstring)."""

    job: "JobSpec"
    h: int
    local_tokens: int
    act_bytes: int

    if TYPE_CHECKING:   # provided by kernels.LayerKernels
        def elementwise(self, name: str, elements: int, nbytes: int, ops_per: int = 1, dtype: str = "bf16") -> int:
            raise NotImplementedError

    @property
    def unfused_biases(self) -> bool:
        """Biases run as kernels of their own: a mixture of experts with add_bias_linear."""
        m = self.job.shape
        return m.bias and m.moe

    def attention_output_bias(self, p: str, backward: bool) -> None:
        """The output projection's bias added before the residual (forward), or its gradient's sum
        over this rank's tokens (backward)."""
        if not self.unfused_biases:
            return
        n, b = self.local_tokens * self.h, self.act_bytes
        if backward:
            self.elementwise(p + "proj_bias.bwd", n, (n + self.h) * b)
        else:
            self.elementwise(p + "proj_bias", n, (2 * n + self.h) * b)

    def expert_bias_forward(self, p: str, received: int, local: int) -> None:
        """_apply_bias: t + b x p over the local experts' tokens (`received` in all), then their cat."""
        if not self.unfused_biases:
            return
        h, b, e = self.h, self.act_bytes, received * self.h
        tokens = received
        self.elementwise(p + "moe.fc2_bias.scale", e, (e + tokens + local * h) * b)
        self.elementwise(p + "moe.fc2_bias.add", e, 3 * e * b)
        self.elementwise(p + "moe.fc2_bias.cat", e, 2 * e * b)

    def expert_bias_backward(self, p: str, received: int, local: int) -> None:
        """The backward of _apply_bias: the bias's and the probabilities' gradients (a product and its
        sum each), the token gradients copied together (split's backward), the probabilities'
        gradients concatenated and added to the activation's."""
        if not self.unfused_biases:
            return
        h, b, e = self.h, self.act_bytes, received * self.h
        tokens = received
        self.elementwise(p + "moe.fc2_bias.bias_grad_mul", e, (2 * e + tokens) * b)
        self.elementwise(p + "moe.fc2_bias.bias_grad_sum", e, (e + local * h) * b)
        self.elementwise(p + "moe.fc2_bias.probs_grad_mul", e, (2 * e + local * h) * b)
        self.elementwise(p + "moe.fc2_bias.probs_grad_sum", e, (e + tokens) * b)
        self.elementwise(p + "moe.fc2_bias.split.bwd", e, 2 * e * b)
        self.elementwise(p + "moe.fc2_bias.probs_cat.bwd", tokens, 2 * tokens * b)
        self.elementwise(p + "moe.fc2_bias.probs_grad_add", tokens, 3 * tokens * b)

    def router_bias_backward(self, p: str, experts: int) -> None:
        """The router bias's gradient: the logits' gradient summed over this rank's tokens."""
        if self.unfused_biases:
            n = self.local_tokens * experts
            self.elementwise(p + "moe.router_bias.bwd", n, (n + experts) * self.act_bytes)
