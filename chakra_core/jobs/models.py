"""Model shapes: named presets (presets/models.yaml, each with its source) or given inline."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

PRESETS = Path(__file__).with_name("presets") / "models.yaml"
VOCAB_DIVISOR = 128
"""Megatron pads the vocabulary to a multiple of 128 x TP (--make-vocab-size-divisible-by 128,
megatron/training/tokenizer/tokenizer.py _vocab_size_with_padding)."""


class ModelSpec(BaseModel):
    """A dense decoder-only transformer."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    layers: PositiveInt = Field(..., description="transformer layers (--num-layers)")
    hidden: PositiveInt = Field(..., description="hidden size (--hidden-size)")
    ffn_hidden: PositiveInt = Field(..., description="MLP hidden size, per up-projection when gated "
                                                     "(--ffn-hidden-size)")
    heads: PositiveInt = Field(..., description="attention heads (--num-attention-heads)")
    kv_heads: PositiveInt | None = Field(None, description="key/value heads (query groups); "
                                                             "default heads (no GQA); 1 is MQA")
    vocab: PositiveInt = Field(..., description="the tokenizer's size, before Megatron's padding")
    max_seq: PositiveInt | None = Field(None, description="longest sequence: the size of learned position embeddings")
    mlp: Literal["swiglu", "geglu", "gelu", "squared-relu"] = Field(
        "swiglu", description="the MLP's activation: gated 'swiglu' (Llama) or 'geglu' (Gemma), two "
                              "up-projections (Shazeer 2020, arXiv 2002.05202); 'gelu' (GPT) or "
                              "'squared-relu' (Nemotron-4, arXiv 2402.16819; So et al. 2021), one")
    norm: Literal["rmsnorm", "layernorm"] = Field("rmsnorm", description="the layers' normalization (--normalization)")
    position: Literal["rope", "learned"] = Field("rope", description="rotary or learned absolute position embeddings")
    tied_embeddings: bool = Field(False, description="the output layer shares the input embedding's weights")
    bias: bool = Field(False, description="linear layers have biases (--add-bias-linear)")
    source: str = Field("", description="where the shape comes from")
    name: str = Field("", description="the preset's name (set for presets)")

    @model_validator(mode="after")
    def _shape(self) -> "ModelSpec":
        if self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} is not divisible by heads {self.heads}")
        if self.heads % self.groups:
            raise ValueError(f"heads {self.heads} is not divisible by kv_heads {self.groups}")
        return self

    @property
    def gated(self) -> bool:
        """A gated MLP: two up-projections, the activation of one times the other."""
        return self.mlp in ("swiglu", "geglu")

    @property
    def groups(self) -> int:
        return self.kv_heads or self.heads

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def padded_vocab(self, tp: int) -> int:
        multiple = VOCAB_DIVISOR * tp
        return -(-self.vocab // multiple) * multiple

    def layer_params(self) -> int:
        """Parameters of one layer: attention (QKV with its query groups, output projection),
        MLP (two up-projections when gated), two norms, biases when the model has them."""
        h, f, d = self.hidden, self.ffn_hidden, self.head_dim
        qkv = h * (self.heads + 2 * self.groups) * d
        up = (2 if self.gated else 1) * h * f
        params = qkv + h * h + up + f * h
        norms = (2 if self.norm == "layernorm" else 1) * 2 * h
        biases = ((self.heads + 2 * self.groups) * d + h + (up // h) + h) if self.bias else 0
        return params + norms + biases

    def layer_params_on(self, tp: int) -> int:
        """Parameters of one layer on one GPU of a TP group: the linear layers and their column
        biases are split, the norms and the row-parallel layers' biases are replicated (Megatron's
        ColumnParallelLinear / RowParallelLinear and TENorm)."""
        row_biases = 2 * self.hidden if self.bias else 0
        return (self.layer_params() - self.norm_params() - row_biases) // tp + self.norm_params() + row_biases

    def norm_params(self) -> int:
        """Parameters of one layer's two norms (replicated over TP)."""
        return (2 if self.norm == "layernorm" else 1) * 2 * self.hidden

    def params(self, tp: int = 1) -> int:
        """All parameters (embedding and output layer counted separately unless tied)."""
        v = self.padded_vocab(tp)
        embeddings = v * self.hidden * (1 if self.tied_embeddings else 2)
        learned = (self.max_seq or 0) * self.hidden if self.position == "learned" else 0
        final_norm = (2 if self.norm == "layernorm" else 1) * self.hidden
        return self.layers * self.layer_params() + embeddings + learned + final_norm


@lru_cache(maxsize=1)
def presets() -> dict[str, ModelSpec]:
    data = yaml.safe_load(PRESETS.read_text(encoding="utf-8")) or {}
    return {name: ModelSpec.model_validate({**fields, "name": name}) for name, fields in data.items()}


def preset(name: str) -> ModelSpec:
    known = presets()
    if name not in known:
        raise ValueError(f"no model preset '{name}'; presets: {', '.join(sorted(known))} "
                         "(or give the shape inline: layers, hidden, ffn_hidden, heads, ...)")
    return known[name]
