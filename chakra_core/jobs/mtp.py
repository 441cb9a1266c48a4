"""Multi-token prediction (DeepSeek-V3's MTP, --mtp-num-layers) as Megatron-Core trains it (a mixin
of `kernels.LayerKernels`).

Read at NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553:
megatron/core/transformer/multi_token_prediction.py (MultiTokenPredictionBlock.forward,
MultiTokenPredictionLayer: _get_embeddings, _concat_embeddings, _proj_and_transformer_layer,
_postprocess; process_mtp_loss, _compute_mtp_acceptance_counts; mtp_on_this_rank: without a custom
pipeline layout every MTP layer is on the last pipeline stage's last model chunk) and
megatron/core/models/gpt/gpt_model.py (_postprocess: the MTP block runs on the decoder's output
after its final norm, then the MTP losses, then the main output layer; a stage running MTP layers
builds its own copy of the word embedding, whose gradient finalize_model_grads all-reduces with
the first stage's).

Per MTP layer k and micro-batch, on the last stage: the embedding of the tokens shifted by k + 1
(and its TP reduce-scatter, as the model's embedding), RMSNorms of it (enorm) and of the incoming
hidden state (hnorm), their concatenation [t, 2h], the column-parallel eh_proj [n, 2h] x [2h, h/tp]
(its input all-gathered over TP, its output all-gathered along the hidden size and split back to
the rank's sequence part), one transformer layer of the model's last layer's kind (a MoE layer in
DeepSeek-V3), the layer's final norm. Then, for each MTP layer, the shared output layer and its
cross entropy, and the acceptance count (an argmax over the vocabulary-parallel logits, two TP
all-gathers of a value per token). The backward mirrors it. MTP layer k is unit layers + k of the
step (its parameters, buckets and fp8 weights).

Not modelled: the label and position rolls (a few bytes per token), the MTP loss scaling, hidden
state mixing (mtp_hsm) and detached heads, MTP layers on a stage of their own ("standalone"),
full recomputation of MTP layers (they are never recomputed here).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from chakra_core.jobs.attention import NORM_OPS
from chakra_core.jobs.layout import mtp_layers_in
from chakra_core.schema import pb

if TYPE_CHECKING:
    from chakra_core.jobs.spec import JobSpec

TOKEN_ID_BYTES = 8
"""int64 token ids."""


class MultiTokenPrediction:
    """The MTP layers of the last pipeline stage (see the module docstring)."""

    job: "JobSpec"
    groups: dict[str, tuple[int, ...]]
    stage: int
    vp: int
    h: int
    n: int
    tp: int
    local_tokens: int
    act_bytes: int
    _layer_key: tuple[int, int | str]
    _deferring: "list[Any] | None" = None   # the combined schedule's delayed weight gradients (moe_overlap.py)

    if TYPE_CHECKING:   # provided by kernels.LayerKernels and its mixins
        def _kernel(self, name: str, kind: str, ops: int, nbytes: int, dtype: str,
                    extra: Iterable[pb.AttributeProto] = ()) -> int:
            raise NotImplementedError

        def elementwise(self, name: str, elements: int, nbytes: int, ops_per: int = 1, dtype: str = "bf16") -> int:
            raise NotImplementedError

        def norm(self, name: str, feeds_fp8: bool = True, width: int | None = None) -> int:
            raise NotImplementedError

        def blocking(self, name: str, role: str, comm_type: int, size: int, part: str | None = None) -> None:
            raise NotImplementedError

        def tp_gather(self, name: str, te: bool = True, width: int | None = None) -> int | None:
            raise NotImplementedError

        def tp_reduce(self, name: str) -> None:
            raise NotImplementedError

        def _gemm_with(self, name: str, m: int, k: int, n: int, gather: bool, cast: bool = False,
                       tp_amax: bool = False, te: bool = True, width: int | None = None) -> int:
            raise NotImplementedError

        def _column_backward(self, name: str, m: int, k: int, n: int, te: bool = True,
                             width: int | None = None) -> tuple[int, int]:
            raise NotImplementedError

        def layer_forward(self, mb: int, layer: int) -> None:
            raise NotImplementedError

        def layer_backward(self, mb: int, layer: int, ready: bool = True) -> None:
            raise NotImplementedError

        def output_layer(self, p: str) -> None:
            raise NotImplementedError

        def output_layer_backward(self, p: str) -> None:
            raise NotImplementedError

        def amax_reduction(self, name: str, layers: int) -> None:
            raise NotImplementedError

        def _keep(self, node: int | None, what: str, elements: int, size: int, output: bool = True) -> None:
            raise NotImplementedError

        def _read(self, node: int | None, *what: str) -> None:
            raise NotImplementedError

        def _await_params(self, unit: int) -> None:
            raise NotImplementedError

        def _fp8_weights(self, layer: int) -> None:
            raise NotImplementedError

        def _grad_ready(self, unit: int) -> None:
            raise NotImplementedError

        @property
        def gemm_in(self) -> int:
            raise NotImplementedError

    @property
    def mtp_here(self) -> int:
        """MTP layers this rank runs, in its last model chunk (the one with the loss)."""
        return mtp_layers_in(self.job, self.stage, self.vp - 1)

    def mtp_forward(self, mb: int) -> None:
        """The MTP layers on the decoder's normalized output, then their heads (see the module docstring)."""
        h, n, t, b = self.h, self.n, self.local_tokens, self.act_bytes
        first = self.job.shape.layers
        for k in range(self.mtp_here):
            p, layer = f"mb{mb}.mtp{k}.", first + k
            self._fp8_weights(layer)
            self._await_params(layer)
            self._layer_key = (mb, f"mtp{k}")
            embedding = self._kernel(p + "embedding", "embedding", n * h, 2 * n * h * b, "bf16")
            self._keep(embedding, "tokens", n, TOKEN_ID_BYTES, output=False)
            self.tp_reduce(p + "embedding")
            self._keep(self.norm(p + "enorm", feeds_fp8=False), "e_in", t * h, b, output=False)
            self._keep(self.norm(p + "hnorm", feeds_fp8=False), "h_in", t * h, b, output=False)
            self.elementwise(p + "concat", 2 * t * h, 4 * t * h * b)
            eh = self._gemm_with(p + "eh_proj", n, 2 * h, h // self.tp, gather=True, cast=True, width=2 * h)
            self._keep(eh, "eh_in", 2 * t * h, self.gemm_in, output=False)
            if "tp" in self.groups:   # gather_from_tensor_model_parallel_region, then the sequence split
                self.blocking(p + "eh_proj.tp_all_gather_output", "tp", pb.ALL_GATHER, n * (h // self.tp) * b)
                self.elementwise(p + "eh_proj.regroup", n * h, 2 * (n + t) * h * b)
            self.amax_reduction(p + "eh_proj", 1)
            self.layer_forward(mb, layer)
            self.amax_reduction(p + "layer", 1)
            self._layer_key = (mb, f"mtp{k}")
            self._keep(self.norm(p + "final_norm", feeds_fp8=False), "norm_in", t * h, b, output=False)
        if self.mtp_here:   # the hidden states of the decoder and every MTP layer, concatenated
            states = (1 + self.mtp_here) * t * h
            self.elementwise(f"mb{mb}.mtp.concat_hidden", states, 2 * states * b)
        for k in range(self.mtp_here):
            p = f"mb{mb}.mtp{k}."
            self._layer_key = (mb, f"mtp{k}")
            self.output_layer(p)
            self._acceptance(p)

    def _acceptance(self, p: str) -> None:
        """_compute_mtp_acceptance_counts: the argmax of the vocabulary-parallel logits (a read of
        them), the per-token maxima and indices all-gathered over TP."""
        n, b = self.n, self.act_bytes
        logits = n * (self.job.shape.padded_vocab(self.tp) // self.tp)
        self.elementwise(p + "acceptance_argmax", logits, logits * b + n * (b + TOKEN_ID_BYTES))
        if "tp" in self.groups:
            self.blocking(p + "acceptance.tp_all_gather_max", "tp", pb.ALL_GATHER, n * b)
            self.blocking(p + "acceptance.tp_all_gather_argmax", "tp", pb.ALL_GATHER, n * TOKEN_ID_BYTES)

    def mtp_backward(self, mb: int) -> None:
        """The MTP heads' backward, then each MTP layer's, last first; each layer's gradients are
        complete after its eh_proj, norms and embedding. The combined EP-overlap schedule
        (moe_overlap.py) interleaves the decoder's layers only: MTP layers run whole inside the
        head's backward, their weight gradients not delayed."""
        held, self._deferring = self._deferring, None
        self._mtp_backward(mb)
        self._deferring = held

    def _mtp_backward(self, mb: int) -> None:
        h, n, t, b = self.h, self.n, self.local_tokens, self.act_bytes
        first = self.job.shape.layers
        for k in reversed(range(self.mtp_here)):
            self._layer_key = (mb, f"mtp{k}")
            self.output_layer_backward(f"mb{mb}.mtp{k}.")
        for k in reversed(range(self.mtp_here)):
            p, layer = f"mb{mb}.mtp{k}.", first + k
            self._layer_key = (mb, f"mtp{k}")
            self._read(self.elementwise(p + "final_norm.bwd", t * h, 4 * t * h * b, 2 * NORM_OPS), "norm_in")
            self.layer_backward(mb, layer, ready=False)
            self.amax_reduction(p + "layer.bwd", 1)
            self._layer_key = (mb, f"mtp{k}")
            if "tp" in self.groups:   # backward of the sequence split (all-gather) and the hidden gather (split)
                self.blocking(p + "eh_proj.bwd.tp_all_gather", "tp", pb.ALL_GATHER, t * h * b)
                self.elementwise(p + "eh_proj.bwd.regroup", n * h, 2 * (n + t) * h * b)
            self._read(self._column_backward(p + "eh_proj", n, 2 * h, h // self.tp, width=2 * h)[1], "eh_in")
            self.amax_reduction(p + "eh_proj.bwd", 1)
            self._read(self.elementwise(p + "enorm.bwd", t * h, 4 * t * h * b, 2 * NORM_OPS), "e_in")
            self._read(self.elementwise(p + "hnorm.bwd", t * h, 4 * t * h * b, 2 * NORM_OPS), "h_in")
            self.tp_gather(p + "embedding.bwd", te=False)   # the embedding's reduce-scatter, backward
            node = self._kernel(p + "embedding.bwd", "embedding", n * h, n * h * (b + 2 * 4), "fp32")
            self._read(node, "tokens")
            # the hidden state's gradient from this layer added to what the main head sent back
            self.elementwise(p + "hidden_grad_add", t * h, 3 * t * h * b)
            self._grad_ready(layer)
