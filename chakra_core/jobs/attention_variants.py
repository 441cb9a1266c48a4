"""Attention variants of a layer's core attention: sliding windows and attention sinks (GPT-OSS).

Sliding window, as Megatron-Core runs it (NVIDIA/Megatron-LM at d98e8a64ddf34856e74b24714e3bedb2f5a39553:
transformer_config.py window_size and window_attn_skip_freq, transformer/utils.py
is_layer_window_attention): query i attends to keys [i - left, i] (Transformer Engine's window_size
(left, 0), attention/dot_product_attention/utils.py get_full_mask at d0067d0d), so `window` =
left + 1 keys, the query's own included: Hugging Face's `sliding_window` (GPT-OSS: 128; its
reference implementation masks keys at distance >= 128). Megatron-Bridge's GPT-OSS provider had
window_size (128, 0), one key more, until NVIDIA-NeMo/Megatron-Bridge 5fcab34f made it
(sliding_window - 1, 0). With window_attn_skip_freq N, layers whose 1-based number is a multiple
of N keep full attention (GPT-OSS: N = 2, HF config `layer_types` sliding, full, sliding, ...);
without it every layer is windowed.

FLOPs: a causal kernel counts s^2 / 2 query-key pairs (the kernels' and Megatron's convention:
the pairs below the diagonal and half the diagonal); a window keeps those at distance < w, the
diagonal still half: (w (2 s - w + 1) - s) / 2 pairs, which is s^2 / 2 at w = s. A rank's
queries of a longer key sequence (allgather context parallelism) count their share seq_q / seq_kv. The kernel's node carries
`attn_window` so that a compute layer can time the key tiles the band touches
(compute_achievable's windowed rule); without the window (w >= the keys) it is the causal kernel.

Attention sinks (Megatron-Core softmax_type 'learnable'; Transformer Engine's softmax_offset; cuDNN's
sink token, transformer_engine/common/fused_attn/fused_attn_f16_arbitrary_seqlen.cu at d0067d0d):
one learned logit per head joins every row's softmax denominator. The fused kernel adds
exp(sink - row max) to each row's sum in the forward, and in the backward reduces each row's
-P_sink x D (D = rowsum(dO x O), which FlashAttention-style backwards compute anyway) into the
sink's gradient: a few operations per query row and head, no matmul.

Chunked attention (Llama 4), as Megatron-Bridge runs it (NVIDIA-NeMo/Megatron-Bridge
src/megatron/bridge/models/llama/llama4_utils.py at v0.3.0, 21b02e0c: Llama4SelfAttention.forward
and chunkify): a sequence longer than `attention_chunk` has its queries, keys and values padded to a
multiple of the chunk and reshaped to [chunk, chunks x batch], so every layer's core attention is one
causal kernel of `chunk` tokens over chunks x batch sequences, each chunk attending only within
itself (HF's Llama 4 keeps full attention on its NoPE layers; Megatron-Bridge chunks those too).
With context parallelism it asserts that each rank's pieces are whole chunks; that case is not
modelled (refused).

Transformer Engine's backends (attention/dot_product_attention/utils.py get_attention_backend at
d0067d0d): learnable softmax runs only in FusedAttention (cuDNN) or unfused, and with context
parallelism only with cp_comm_type a2a; a sliding window with context parallelism not with p2p.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from chakra_core.jobs.models import ModelSpec
    from chakra_core.jobs.spec import JobSpec

SINK_FORWARD_OPS = 3
"""Per query row and head: the sink logit less the row maximum, its exponential, its add to the sum."""
SINK_BACKWARD_OPS = 2
"""Per query row and head: P_sink x D and its accumulation into the sink's gradient."""


def layer_window(model: "ModelSpec", layer: int) -> int | None:
    """The keys each query of layer `layer` (0-based) attends to, or None for full attention."""
    if model.window is None:
        return None
    freq = model.window_attn_skip_freq
    return None if freq is not None and (layer + 1) % freq == 0 else model.window


def windowed_layers(model: "ModelSpec") -> int:
    """Layers with a sliding window."""
    return sum(1 for layer in range(model.layers) if layer_window(model, layer) is not None)


def windowed_flops(batch: int, seq_q: int, seq_kv: int, d: int, window: int) -> int:
    """FLOPs of a causal attention forward with a window of `window` <= seq_kv keys (both matmuls,
    `batch` heads x sequences of seq_q queries): 4 d x the pairs in the band (module docstring)."""
    return 4 * batch * d * seq_q * (window * (2 * seq_kv - window + 1) - seq_kv) // (2 * seq_kv)


def mean_keys(seq: int, window: int | None) -> float:
    """Keys a query attends to on average in a causal layer of `seq` tokens: seq / 2 (the causal
    convention), (w (2 s - w + 1) - s) / (2 s) with a window w < s."""
    if window is None or window >= seq:
        return seq / 2
    return (window * (2 * seq - window + 1) - seq) / (2 * seq)


def attention_chunks(model: "ModelSpec", seq: int) -> int:
    """Chunks a sequence of `seq` tokens is cut into for the core attention (1: not chunked)."""
    chunk = model.attention_chunk
    return -(-seq // chunk) if chunk is not None and seq > chunk else 1


def chunked_mean_keys(seq: int, chunk: int) -> float:
    """Keys a query attends to on average when `seq` tokens are cut into causal chunks of `chunk`
    (the causal convention, half of each chunk's square; a shorter last chunk its own)."""
    full, rest = divmod(seq, chunk)
    return (full * chunk * chunk / 2 + rest * rest / 2) / seq


def attention_variant_problems(job: "JobSpec") -> list[str]:
    """What Transformer Engine cannot run with context parallelism (module docstring), and chunked
    attention where it is not modelled."""
    m, p = job.shape, job.parallel
    out = []
    if attention_chunks(m, job.training.seq) > 1:
        if p.cp > 1:
            out.append(f"model.attention_chunk ({m.attention_chunk} tokens, shorter than training.seq "
                       f"{job.training.seq}) with parallel.cp > 1 is not modelled (Megatron-Bridge then needs "
                       "every CP rank's pieces to be whole chunks): use cp 1 or a sequence of at most one chunk")
        if job.training.attention == "unfused":
            out.append("model.attention_chunk needs the fused attention (training.attention: flash), as "
                       "Megatron-Bridge's Llama 4 attention cuts the sequence for it")
    if p.cp > 1 and m.window is not None and p.cp_comm_type in ("p2p", "a2a+p2p"):
        out.append("model.window with parallel.cp > 1 needs parallel.cp_comm_type a2a or allgather (Transformer "
                   "Engine runs no sliding window in p2p ring attention)")
    if p.cp > 1 and m.attention_sinks and p.cp_comm_type != "a2a":
        out.append("model.attention_sinks with parallel.cp > 1 needs parallel.cp_comm_type a2a (Transformer "
                   "Engine's FusedAttention runs learnable softmax with context parallelism only so)")
    return out


class AttentionVariants:
    """The window and sink terms of a layer's fused attention kernel (a mixin of kernels.LayerKernels)."""

    job: "JobSpec"
    _layer_key: tuple[int, int | str]

    def attention_window(self, seq_kv: int, causal: bool) -> int | None:
        """The window of the layer being written when it binds (fewer keys than `seq_kv`)."""
        layer = self._layer_key[1]
        if not causal or not isinstance(layer, int):
            return None
        window = layer_window(self.job.shape, layer)
        return window if window is not None and window < seq_kv else None

    def sink_ops(self, rows: int, backward: bool) -> int:
        """The sinks' softmax term for `rows` query rows x heads (0 without sinks)."""
        if not self.job.shape.attention_sinks:
            return 0
        return rows * (SINK_BACKWARD_OPS if backward else SINK_FORWARD_OPS)
