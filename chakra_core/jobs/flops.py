"""Model FLOPs of a training step, counted as the published tables count them.

TFLOP/s per GPU = model FLOPs per step / (step time x GPUs); MFU = that / the GPU's dense BF16
peak. Which count a table uses moves the figure by up to 12%, so each comparison names one
(benchmarks/data/training-runs.yaml quotes each source):

- `nemo`: NeMo's nemo/utils/flops_formulas.py (llama2/llama3/gpt3), forward and backward without
  recomputation, attention counted as full s^2, the unpadded vocabulary:
  gbs s L h^2 (12 + 12 G/A + 18 F/h + 12 s/h + 6 V/(L h)) for SwiGLU models (12 F/h ... for a
  GELU MLP, i.e. 24 h^2 per layer with F = 4h: GPT-3).
- `megatron_bridge`: Megatron-Bridge's flop_utils.transformer_flops: the same linear layers,
  causal attention counted half (s/2), the vocabulary padded to 128 x TP.
- `megatron_sc21`: Narayanan et al., SC'21 (arXiv 2104.04473), eq. 3:
  96 B s l h^2 (1 + s / (6 h) + V / (16 l h)), counting the forward pass recomputed by full
  activation recomputation.
"""

from __future__ import annotations

from chakra_core.jobs.spec import JobSpec

FORMULAS = ("nemo", "megatron_bridge", "megatron_sc21")


def model_flops(job: JobSpec, formula: str = "nemo") -> float:
    """FLOPs of one step under `formula`."""
    m, t = job.shape, job.training
    B, s, l, h = t.global_batch, t.seq, m.layers, m.hidden
    if formula == "megatron_sc21":
        V = m.vocab
        return 96.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    if formula not in FORMULAS:
        raise ValueError(f"unknown FLOPs formula {formula!r}; known: {', '.join(FORMULAS)}")
    d, f = m.head_dim, m.ffn_hidden
    linear = h * (m.heads + 2 * m.groups) * d + h * h + (3 if m.mlp == "swiglu" else 2) * h * f
    if formula == "nemo":
        attention, V = 12 * s * h, m.vocab          # per token and layer, fwd + bwd, full s^2
    else:
        attention, V = 6 * s * h, m.padded_vocab(job.parallel.tp)   # causal: half
    return float(B * s * (l * (6 * linear + attention) + 6 * h * V))
