"""Model shapes: named presets (presets/models.yaml, each with its source) or given inline."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, SerializationInfo, SerializerFunctionWrapHandler, \
    model_serializer, model_validator

PRESETS = Path(__file__).with_name("presets") / "models.yaml"
VOCAB_DIVISOR = 128
"""Megatron pads the vocabulary to a multiple of 128 x TP (--make-vocab-size-divisible-by 128,
megatron/training/tokenizer/tokenizer.py _vocab_size_with_padding)."""


MOE_KEYS = ("topk", "moe_ffn_hidden", "shared_expert_ffn", "dense_layers_first", "moe_layer_step",
            "capacity_factor", "router_score_function", "router_groups", "router_group_topk", "router_expert_bias")
"""Keys that describe a mixture of experts (they need num_experts)."""
MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
OPTIONAL_KEYS = ("kv_channels", "num_experts", *MOE_KEYS, "window", "window_attn_skip_freq", "attention_chunk",
                 "attention_sinks", *MLA_KEYS, "qk_layernorm", "mtp_num_layers", "make_vocab_size_divisible_by")
"""Keys a model echoes only when set: a dense model's echo (results.json, the trace cache's digest)
stays what it was before mixtures of experts, attention variants, latent attention and multi-token
prediction were modelled."""
MLA_DEFAULTS = {"qk_head_dim": 128, "qk_pos_emb_head_dim": 64, "v_head_dim": 128}
"""Megatron-LM's argument defaults (megatron/training/arguments.py at d98e8a64: --qk-head-dim 128,
--qk-pos-emb-head-dim 64, --v-head-dim 128)."""


class ModelSpec(BaseModel):
    """A decoder-only transformer: dense, or a mixture of experts (`num_experts`)."""

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
    mlp: Literal["swiglu", "geglu", "gelu", "squared-relu", "clamped-swiglu"] = Field(
        "swiglu", description="the MLP's activation: gated 'swiglu' (Llama) or 'geglu' (Gemma), two "
                              "up-projections (Shazeer 2020, arXiv 2002.05202); 'gelu' (GPT) or "
                              "'squared-relu' (Nemotron-4, arXiv 2402.16819; So et al. 2021), one; "
                              "'clamped-swiglu' (GPT-OSS's experts: x sigmoid(1.702 x) of the gate "
                              "clamped to 7, times the linear half clamped to +-7 plus 1)")
    norm: Literal["rmsnorm", "layernorm"] = Field("rmsnorm", description="the layers' normalization (--normalization)")
    position: Literal["rope", "learned"] = Field("rope", description="rotary or learned absolute position embeddings")
    tied_embeddings: bool = Field(False, description="the output layer shares the input embedding's weights")
    bias: bool = Field(False, description="linear layers have biases (--add-bias-linear)")
    kv_channels: PositiveInt | None = Field(None, description="head size (--kv-channels); default hidden / heads "
                                                              "(Qwen3: 128 whatever the hidden size)")
    # Attention variants (chakra_core/jobs/attention_variants.py)
    window: PositiveInt | None = Field(None, description="sliding-window attention: the keys each query attends "
                                                         "to, itself included (HF sliding_window; Megatron's "
                                                         "--window-size is (window - 1, 0)); none: full")
    window_attn_skip_freq: PositiveInt | None = Field(None, description="with window: layers whose 1-based number is "
                                                                        "a multiple of it keep full attention "
                                                                        "(--window-attn-skip-freq; GPT-OSS 2); "
                                                                        "none: every layer windowed")
    attention_chunk: PositiveInt | None = Field(None, description="chunked attention: a longer sequence is cut "
                                                                  "into chunks of this many tokens, each attending "
                                                                  "only within itself (Llama 4: 8192); none: full")
    attention_sinks: bool | None = Field(None, description="a learned sink logit per head in each softmax "
                                                           "(Megatron's softmax_type learnable; GPT-OSS)")
    # Mixture of experts (Megatron-Core megatron/core/transformer/moe/, NVIDIA/Megatron-LM at d98e8a64)
    num_experts: PositiveInt | None = Field(None, description="routed experts per MoE layer (--num-experts); "
                                                              "none: a dense model")
    topk: PositiveInt | None = Field(None, description="experts each token is routed to (--moe-router-topk; "
                                                       "Megatron's default 2)")
    moe_ffn_hidden: PositiveInt | None = Field(None, description="an expert's FFN hidden size, per up-projection "
                                                                 "when gated (--moe-ffn-hidden-size; default "
                                                                 "ffn_hidden, as Megatron's)")
    shared_expert_ffn: int | None = Field(None, ge=0, description="the shared experts' FFN hidden size, all of "
                                                                  "them together (--moe-shared-expert-intermediate-"
                                                                  "size); 0 or none: no shared expert")
    dense_layers_first: int | None = Field(None, ge=0, description="leading layers with a dense MLP of ffn_hidden "
                                                                   "(DeepSeek's first 3; --moe-layer-freq "
                                                                   "[0]*k+[1]*(L-k)); default 0")
    moe_layer_step: PositiveInt | None = Field(None, description="every step-th layer has a MoE block, the others "
                                                                 "a dense MLP of ffn_hidden (HF Llama 4's "
                                                                 "interleave_moe_layer_step; --moe-layer-freq "
                                                                 "([0]*(step-1)+[1])*(L/step)); default 1")
    capacity_factor: float | None = Field(None, gt=0, description="expert capacity factor "
                                                                  "(--moe-expert-capacity-factor); none: dropless")
    router_score_function: Literal["softmax", "sigmoid"] | None = Field(
        None, description="the router's scores (--moe-router-score-function; default softmax; DeepSeek-V3: sigmoid)")
    router_groups: PositiveInt | None = Field(None, description="expert groups of group-limited routing "
                                                                "(--moe-router-num-groups; DeepSeek-V3: 8)")
    router_group_topk: PositiveInt | None = Field(None, description="groups a token's experts are chosen from "
                                                                    "(--moe-router-group-topk; DeepSeek-V3: 4)")
    router_expert_bias: bool | None = Field(None, description="auxiliary-loss-free balancing: a per-expert bias "
                                                              "updated from the step's token counts "
                                                              "(--moe-router-enable-expert-bias)")
    # Multi-head latent attention (megatron/core/transformer/multi_latent_attention.py at d98e8a64)
    q_lora_rank: PositiveInt | None = Field(None, description="the query's low-rank (latent) size (--q-lora-rank); "
                                                              "none: queries projected from the hidden state")
    kv_lora_rank: PositiveInt | None = Field(None, description="the keys' and values' latent size (--kv-lora-rank): "
                                                               "set, the model uses multi-head latent attention")
    qk_head_dim: PositiveInt | None = Field(None, description="a head's query/key size without position "
                                                              "(--qk-head-dim; default 128)")
    qk_pos_emb_head_dim: PositiveInt | None = Field(None, description="a head's rotary query/key part "
                                                                      "(--qk-pos-emb-head-dim; default 64)")
    v_head_dim: PositiveInt | None = Field(None, description="a head's value size (--v-head-dim; default 128)")
    qk_layernorm: bool | None = Field(None, description="RMSNorm of each head's query and key after the QKV "
                                                        "projection (--qk-layernorm; Qwen3); with latent "
                                                        "attention, of the query and key/value latents")
    mtp_num_layers: PositiveInt | None = Field(None, description="multi-token prediction layers (--mtp-num-layers; "
                                                                 "DeepSeek-V3: 1)")
    make_vocab_size_divisible_by: PositiveInt | None = Field(
        None, description="the vocabulary is padded to a multiple of this x TP (Megatron's "
                          "--make-vocab-size-divisible-by; default 128)")
    source: str = Field("", description="where the shape comes from")
    name: str = Field("", description="the preset's name (set for presets)")

    @model_serializer(mode="wrap")
    def _echo(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> object:
        data = handler(self)
        if isinstance(data, dict):
            for key in OPTIONAL_KEYS:
                if data.get(key) is None:
                    data.pop(key, None)
        return data

    @model_validator(mode="after")
    def _shape(self) -> "ModelSpec":
        if self.kv_channels is None and self.hidden % self.heads and not self.mla:
            raise ValueError(f"hidden {self.hidden} is not divisible by heads {self.heads} (or give kv_channels)")
        if self.heads % self.groups:
            raise ValueError(f"heads {self.heads} is not divisible by kv_heads {self.groups}")
        moe_keys = [key for key in MOE_KEYS if getattr(self, key) is not None]
        if self.num_experts is None and moe_keys:
            raise ValueError(f"{', '.join(moe_keys)} describe a mixture of experts: give num_experts too")
        if self.num_experts is not None:
            if self.router_topk > self.num_experts:
                raise ValueError(f"topk {self.router_topk} is more than num_experts {self.num_experts}")
            if self.dense_layers_first and self.moe_layer_step not in (None, 1):
                raise ValueError("dense_layers_first and moe_layer_step: give one layer pattern, not both")
            if self.first_moe_layer >= self.layers:
                raise ValueError(f"{'moe_layer_step' if self.moe_layer_step else 'dense_layers_first'} "
                                 f"{self.first_moe_layer + (1 if self.moe_layer_step else 0)} leaves no MoE "
                                 f"layer of the {self.layers} layers")
            self._router_groups_fit(self.num_experts)
        self._latent_attention_fits()
        if self.attention_chunk is not None and (self.window is not None or self.mla):
            raise ValueError("attention_chunk (chunked attention) goes with neither window nor latent attention")
        if self.window_attn_skip_freq is not None and self.window is None:
            raise ValueError("window_attn_skip_freq needs window (the sliding window it skips)")
        if self.mlp == "clamped-swiglu" and (self.num_experts is None or self.first_moe_layer or self.shared_ffn):
            # Megatron-Core's fused bias-activation takes a quick-GELU GLU only in the routed experts:
            # mlp.py and shared_experts.py raise "Only support fusion of gelu and swiglu" (d98e8a64)
            raise ValueError("mlp clamped-swiglu is modelled in routed experts only: give num_experts, no "
                             "dense_layers_first and no shared_expert_ffn")
        return self

    def _router_groups_fit(self, experts: int) -> None:
        """Group-limited routing (megatron/core/transformer/moe/moe_utils.py group_limited_topk at
        d98e8a64): experts split in equal groups, a token's topk experts from its best groups."""
        groups, chosen = self.router_groups, self.router_group_topk
        if (groups is None) != (chosen is None):
            raise ValueError("router_groups and router_group_topk go together (group-limited routing)")
        if groups is not None and chosen is not None:
            if experts % groups or chosen > groups:
                raise ValueError(f"router_groups {groups} must divide num_experts {experts} and be at least "
                                 f"router_group_topk {chosen}")
            if self.router_topk > chosen * (experts // groups):
                raise ValueError(f"topk {self.router_topk} is more than the experts of router_group_topk "
                                 f"{chosen} groups")

    def _latent_attention_fits(self) -> None:
        given = [key for key in MLA_KEYS if key != "kv_lora_rank" and getattr(self, key) is not None]
        if not self.mla:
            if given:
                raise ValueError(f"{', '.join(given)} describe multi-head latent attention: give kv_lora_rank too")
            return
        # megatron/training/arguments.py at d98e8a64: MLA is not combined with query groups
        if self.kv_heads not in (None, self.heads):
            raise ValueError("kv_heads with kv_lora_rank: latent attention has a key and value per head "
                             "(Megatron does not combine it with --group-query-attention)")
        if self.kv_channels is not None:
            raise ValueError("kv_channels with kv_lora_rank: latent attention's head sizes are qk_head_dim + "
                             "qk_pos_emb_head_dim (query, key) and v_head_dim (value)")
        if self.position != "rope" or self.bias or self.window is not None or self.attention_sinks:
            raise ValueError("latent attention applies RoPE to its decoupled part, has no biases and is "
                             "modelled without windows or sinks: position rope, bias false")

    # Multi-head latent attention and multi-token prediction ---------------------------------------
    @property
    def mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def nope_dim(self) -> int:
        return self.qk_head_dim or MLA_DEFAULTS["qk_head_dim"]

    @property
    def rope_dim(self) -> int:
        return self.qk_pos_emb_head_dim or MLA_DEFAULTS["qk_pos_emb_head_dim"]

    @property
    def qk_dim(self) -> int:
        """A head's query and key size: head_dim, or with latent attention its nope and rope parts."""
        return self.nope_dim + self.rope_dim if self.mla else self.head_dim

    @property
    def v_dim(self) -> int:
        """A head's value size."""
        return (self.v_head_dim or MLA_DEFAULTS["v_head_dim"]) if self.mla else self.head_dim

    @property
    def mtp_layers(self) -> int:
        return self.mtp_num_layers or 0

    def mla_replicated_params(self) -> int:
        """A latent attention layer's parameters every TP rank holds whole: the down projections
        (TELinear with parallel_mode "duplicated") and, with qk_layernorm, the latents' norms."""
        if not self.mla:
            return 0
        q_lora, kv_lora = self.q_lora_rank or 0, self.kv_lora_rank or 0
        norms = (q_lora + kv_lora) if self.qk_layernorm else 0
        return self.hidden * (q_lora + kv_lora + self.rope_dim) + norms

    def attention_params(self) -> int:
        """One layer's attention weights (biases and sinks aside): QKV and output projections and,
        with qk_layernorm, the per-head query and key norms (one weight of head size each, shared by
        the heads); with latent attention (multi_latent_attention.py MLASelfAttention): the q
        down- and up-projection (or one q projection without q_lora_rank), the kv down-projection
        with the rope part, the kv up-projection to the nope keys and values, the output projection."""
        h, a = self.hidden, self.heads
        if not self.mla:
            d = self.head_dim
            return h * (a + 2 * self.groups) * d + a * d * h + (2 * d if self.qk_layernorm else 0)
        up = (self.q_lora_rank or h) * a * self.qk_dim + (self.kv_lora_rank or 0) * a * (self.nope_dim + self.v_dim)
        return self.mla_replicated_params() + up + a * self.v_dim * h

    def tp_replicated_params(self) -> int:
        """Per layer: the parameters each TP rank holds whole whose gradients Megatron all-reduces
        over TP (finalize_model_grads._allreduce_non_tensor_model_parallel_grads at d98e8a64:
        sequence-parallel norms and duplicated linears, and the QK norms)."""
        qk_norms = 2 * self.head_dim if self.qk_layernorm and not self.mla else 0
        return self.norm_params() + self.mla_replicated_params() + qk_norms

    def mtp_extra_params(self) -> int:
        """An MTP layer's parameters beside its transformer layer (multi_token_prediction.py
        MultiTokenPredictionLayer): enorm, hnorm, the 2h -> h eh_proj and the final norm; the
        embedding and the output layer are the model's own, shared."""
        norm = 2 if self.norm == "layernorm" else 1
        return 3 * norm * self.hidden + 2 * self.hidden * self.hidden

    def mtp_params(self) -> int:
        """Parameters the MTP layers add (DeepSeek-V3: 11.5B beside the 671B)."""
        layer = self.layer_params() + (self.expert_params() + self.moe_dense_params() - self.mlp_params()
                                       if self.moe else 0)
        return self.mtp_layers * (layer + self.mtp_extra_params())

    # Mixture of experts -------------------------------------------------------------------------
    @property
    def moe(self) -> bool:
        return self.num_experts is not None

    @property
    def router_topk(self) -> int:
        # megatron/core/transformer/transformer_config.py: moe_router_topk: int = 2
        return self.topk or 2

    @property
    def expert_ffn(self) -> int:
        # megatron/training/arguments.py: moe_ffn_hidden_size defaults to ffn_hidden_size
        return self.moe_ffn_hidden or self.ffn_hidden

    @property
    def shared_ffn(self) -> int:
        return self.shared_expert_ffn or 0

    @property
    def first_moe_layer(self) -> int:
        """The first layer with a MoE block (0-based); every layer before it is dense."""
        return self.moe_layer_step - 1 if self.moe_layer_step else self.dense_layers_first or 0

    def is_moe_layer(self, layer: int) -> bool:
        """Layer `layer` (0-based) has a MoE block: every layer after the leading dense ones
        (Megatron's --moe-layer-freq as the list [0]*k + [1]*(L-k)), or every step-th one (HF
        Llama 4: moe_layers = range(step - 1, L, step))."""
        if self.num_experts is None or layer < self.first_moe_layer:
            return False
        return self.moe_layer_step is None or (layer + 1) % self.moe_layer_step == 0

    @property
    def moe_layers(self) -> int:
        if not self.moe:
            return 0
        if self.moe_layer_step:
            return self.layers // self.moe_layer_step
        return self.layers - self.first_moe_layer

    def up_projections(self) -> int:
        return 2 if self.gated else 1

    def expert_params(self) -> int:
        """Parameters of one MoE layer's routed experts: each a (gated) MLP of expert_ffn (and its
        fc1 and fc2 biases: TEGroupedMLP's GroupedLinear with add_bias_linear)."""
        return (self.num_experts or 0) * ((self.up_projections() + 1) * self.hidden * self.expert_ffn
                                          + self.mlp_biases(self.expert_ffn))

    def moe_dense_params(self) -> int:
        """Parameters of a MoE layer's block beside its routed experts: router (h x experts, and a
        bias per expert with add_bias_linear: router.py; replicated over TP) and shared experts (a
        TP-split MLP)."""
        shared = (self.up_projections() + 1) * self.hidden * self.shared_ffn
        router_bias = (self.num_experts or 0) if self.bias else 0
        return (self.hidden * (self.num_experts or 0) + shared + router_bias
                + (self.mlp_biases(self.shared_ffn) if self.shared_ffn else 0))

    def mlp_biases(self, ffn: int) -> int:
        """An MLP's biases: fc1's (both up-projections when gated) and fc2's."""
        return self.up_projections() * ffn + self.hidden if self.bias else 0

    @property
    def gated(self) -> bool:
        """A gated MLP: two up-projections, the activation of one times the other."""
        return self.mlp in ("swiglu", "geglu", "clamped-swiglu")

    @property
    def groups(self) -> int:
        return self.kv_heads or self.heads

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden // self.heads

    def padded_vocab(self, tp: int) -> int:
        multiple = (self.make_vocab_size_divisible_by or VOCAB_DIVISOR) * tp
        return -(-self.vocab // multiple) * multiple

    def layer_params(self) -> int:
        """Parameters of one dense layer: attention (attention_params), MLP (two up-projections when
        gated), two norms, biases when the model has them."""
        h, f, d = self.hidden, self.ffn_hidden, self.head_dim
        up = (2 if self.gated else 1) * h * f
        params = self.attention_params() + up + f * h
        norms = (2 if self.norm == "layernorm" else 1) * 2 * h
        biases = ((self.heads + 2 * self.groups) * d + h + (up // h) + h) if self.bias else 0
        sinks = self.heads if self.attention_sinks else 0   # one logit per head, split over TP
        return params + norms + biases + sinks

    def layer_params_on(self, tp: int) -> int:
        """Parameters of one layer on one GPU of a TP group: the linear layers and their column
        biases are split, the norms, duplicated linears and the row-parallel layers' biases are
        replicated (Megatron's ColumnParallelLinear / RowParallelLinear, TELinear "duplicated" and TENorm)."""
        whole = self.tp_replicated_params() + (2 * self.hidden if self.bias else 0)
        return (self.layer_params() - whole) // tp + whole

    def norm_params(self) -> int:
        """Parameters of one layer's two norms (replicated over TP)."""
        return (2 if self.norm == "layernorm" else 1) * 2 * self.hidden

    def params(self, tp: int = 1) -> int:
        """All parameters (embedding and output layer counted separately unless tied); the MTP
        layers aside, as model cards count them (mtp_params)."""
        v = self.padded_vocab(tp)
        embeddings = v * self.hidden * (1 if self.tied_embeddings else 2)
        learned = (self.max_seq or 0) * self.hidden if self.position == "learned" else 0
        final_norm = (2 if self.norm == "layernorm" else 1) * self.hidden
        moe = self.moe_layers * (self.expert_params() + self.moe_dense_params() - self.mlp_params())
        return self.layers * self.layer_params() + moe + embeddings + learned + final_norm

    def active_params(self) -> int:
        """Parameters a token passes through: the routed experts counted topk of num_experts (the
        MTP layers aside, as params())."""
        idle = self.moe_layers * self.expert_params() * ((self.num_experts or 1) - self.router_topk)
        return self.params() - idle // (self.num_experts or 1)

    def mlp_params(self) -> int:
        """Parameters of a dense layer's MLP (the block a MoE layer replaces), biases included."""
        return (self.up_projections() + 1) * self.hidden * self.ffn_hidden + self.mlp_biases(self.ffn_hidden)

    def mlp_params_on(self, tp: int) -> int:
        """A dense MLP's parameters on one GPU of a TP group: fc2's bias is replicated."""
        row_bias = self.hidden if self.bias else 0
        return (self.mlp_params() - row_bias) // tp + row_bias


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
