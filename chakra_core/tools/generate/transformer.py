"""Model-based pre-execution traces of a Megatron-style GPT training iteration
(`chakra-sim generate transformer`).

One trace per rank under data (DP), tensor (TP, optionally with sequence parallelism, SP) and
pipeline (PP) parallelism. Compute nodes carry `num_ops` (FLOPs) and `tensor_size` (bytes moved)
for a roofline model; collectives carry `comm_type`, `comm_size` and the communicator group
(`pg_name`, groups defined by a METADATA node per rank); pipeline stages exchange activations and
gradients with COMM_SEND/COMM_RECV. Nodes list the tensors they read and write (weights,
gradients, Adam state, activations) as the PyTorch converter does, so a memory model can follow
their lifetimes. docs/tools.md lists every kernel with its FLOP and byte formulas and what the
tensors model; `comm_size` follows docs/collectives.md.

This module holds the program of a rank (forward and backward of every micro-batch in pipeline
schedule order, then gradient synchronisation and the optimizer step) and writes the traces; the
configuration is in `transformer_config`, the building blocks in `rank`.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Iterator

from chakra_core.schema import pb
from chakra_core.et.build import metadata, write_rank_files
from chakra_core.tools.generate.rank import P2POps, RankBuilder
from chakra_core.tools.generate.transformer_config import (OPTIMIZER_FP32_STATE_BYTES, OPTIMIZER_OPS_PER_PARAM,
                                                           TransformerConfig)


class _TransformerRank(RankBuilder):
    """The program of one rank: its stage's layers, for every micro-batch, in schedule order."""

    # One micro-batch ------------------------------------------------------------------------------------
    def forward(self, mb: int) -> None:
        cfg = self.cfg
        h, t, n, b, s = cfg.hidden, cfg.tp, cfg.tokens, cfg.micro_batch, cfg.seq
        a, dh, f = cfg.heads // cfg.tp, cfg.hidden // cfg.heads, cfg.f
        local, sl = self.local_tokens, self.local_seq
        if self.first:
            name = f"mb{mb}.embedding"
            emb = self.act(s, b, h)
            self.kernel(name, "embedding", n * h, 2 * n * h * cfg.e, self.params(None, "embedding.weight"), [emb])
            x = self.tp_out(name, emb) if t > 1 else emb
        else:
            x = self._boundary("act_in", mb)
        for layer in self._layers():
            p = f"mb{mb}.L{layer}."
            W = functools.partial(self.params, layer)
            ln1 = self.act(sl, b, h)
            self.elementwise(p + "ln1", local * h, 2, [x, *W("ln1.weight", "ln1.bias")], [ln1])
            ln1_full = self.tp_in(p + "ln1", ln1)
            qkv = self.act(s, b, 3 * h // t)
            self.gemm(p + "qkv", n, h, 3 * h // t, inputs=[ln1_full, *W("qkv.weight", "qkv.bias")], outputs=[qkv])
            scores = self.act(b, a, s, s)
            self.gemm(p + "attn_scores", s, dh, s, batch=b * a, kind="bmm", inputs=[qkv], outputs=[scores])
            probs = self.act(b, a, s, s)
            self.elementwise(p + "softmax", b * a * s * s, 2, [scores], [probs])
            context = self.act(s, b, h // t)
            self.gemm(p + "attn_context", s, s, dh, batch=b * a, kind="bmm", inputs=[probs, qkv],
                      outputs=[context])
            proj = self.act(s, b, h)
            self.gemm(p + "attn_proj", n, h // t, h, inputs=[context, *W("proj.weight", "proj.bias")],
                      outputs=[proj])
            proj = self.tp_out(p + "attn_proj", proj)
            x1 = self.act(sl, b, h)
            self.elementwise(p + "residual1", local * h, 3, [x, proj], [x1])
            ln2 = self.act(sl, b, h)
            self.elementwise(p + "ln2", local * h, 2, [x1, *W("ln2.weight", "ln2.bias")], [ln2])
            ln2_full = self.tp_in(p + "ln2", ln2)
            fc1 = self.act(s, b, f // t)
            self.gemm(p + "fc1", n, h, f // t, inputs=[ln2_full, *W("fc1.weight", "fc1.bias")], outputs=[fc1])
            gelu = self.act(s, b, f // t)
            self.elementwise(p + "gelu", n * f // t, 2, [fc1], [gelu])
            fc2 = self.act(s, b, h)
            self.gemm(p + "fc2", n, f // t, h, inputs=[gelu, *W("fc2.weight", "fc2.bias")], outputs=[fc2])
            fc2 = self.tp_out(p + "fc2", fc2)
            out = self.act(sl, b, h)
            self.elementwise(p + "residual2", local * h, 3, [x1, fc2], [out])
            # what the backward pass reads (no dropout, no recomputation)
            self.saved[(mb, layer)] = dict(x=x, ln1=ln1, ln1_full=ln1_full, qkv=qkv, probs=probs,
                                           context=context, x1=x1, ln2=ln2, ln2_full=ln2_full, fc1=fc1,
                                           gelu=gelu)
            x = out
        if self.last:
            p = f"mb{mb}."
            v = cfg.vocab // t
            y = self.act(sl, b, h)
            self.elementwise(p + "final_ln", local * h, 2, [x, *self.params(None, "final_ln.weight",
                                                                             "final_ln.bias")], [y])
            y_full = self.tp_in(p + "final_ln", y)
            logits = self.act(s, b, v)
            self.gemm(p + "lm_head", n, h, v, inputs=[y_full, *self.params(None, "lm_head.weight")],
                      outputs=[logits])
            # vocab-parallel cross entropy keeps the fp32 softmax for the backward pass
            softmax = self.tensor((s, b, v), dtype="fp32")
            self.elementwise(p + "cross_entropy", n * v, 2, [logits], [softmax])
            if t > 1:   # vocab-parallel cross entropy: max, target logit, sum of exponentials (fp32)
                for what in ("max", "target", "sum_exp"):
                    self.blocking(f"{p}cross_entropy.tp_all_reduce_{what}", pb.ALL_REDUCE, n * 4,
                                  self.groups.tp)
            self.saved[(mb, "head")] = dict(x=x, y=y, y_full=y_full, softmax=softmax)
        else:
            self.boundary[("act_out", mb)] = x

    def backward(self, mb: int) -> None:
        cfg = self.cfg
        h, t, n, b, s = cfg.hidden, cfg.tp, cfg.tokens, cfg.micro_batch, cfg.seq
        a, dh, f = cfg.heads // cfg.tp, cfg.hidden // cfg.heads, cfg.f
        local, sl = self.local_tokens, self.local_seq
        if self.last:
            p = f"mb{mb}."
            v = cfg.vocab // t
            head = self.saved.pop((mb, "head"))
            dlogits = self.act(s, b, v)
            self.elementwise(p + "cross_entropy.bwd", n * v, 2, [head["softmax"]], [dlogits])
            dy = self.column_bwd(p + "lm_head", n, h, v, dlogits, head["y"], head["y_full"],
                                 self.params(None, "lm_head.weight"), self.param_grads(None, "lm_head.weight"))
            grad = self.act(sl, b, h)
            self.elementwise(p + "final_ln.bwd", local * h, 2,
                             [dy, head["x"], *self.params(None, "final_ln.weight", "final_ln.bias")],
                             [grad, *self.param_grads(None, "final_ln.weight", "final_ln.bias")])
        else:
            grad = self._boundary("grad_in", mb)
        for layer in reversed(self._layers()):
            p = f"mb{mb}.L{layer}."
            W = functools.partial(self.params, layer)
            G = functools.partial(self.param_grads, layer)
            saved = self.saved.pop((mb, layer))
            d_fc2 = self.act(sl, b, h)
            self.elementwise(p + "residual2.bwd", local * h, 3, [grad], [d_fc2])
            d_gelu = self.row_bwd(p + "fc2", n, f // t, h, d_fc2, saved["gelu"], W("fc2.weight"),
                                  G("fc2.weight", "fc2.bias"))
            d_fc1 = self.act(s, b, f // t)
            self.elementwise(p + "gelu.bwd", n * f // t, 2, [d_gelu, saved["fc1"]], [d_fc1])
            d_ln2 = self.column_bwd(p + "fc1", n, h, f // t, d_fc1, saved["ln2"], saved["ln2_full"],
                                    W("fc1.weight"), G("fc1.weight", "fc1.bias"))
            d_x1 = self.act(sl, b, h)   # the layer norm's gradient plus the residual's
            self.elementwise(p + "ln2.bwd", local * h, 2, [d_ln2, saved["x1"], *W("ln2.weight", "ln2.bias"), grad],
                             [d_x1, *G("ln2.weight", "ln2.bias")])
            d_proj = self.act(sl, b, h)
            self.elementwise(p + "residual1.bwd", local * h, 3, [d_x1], [d_proj])
            d_context = self.row_bwd(p + "attn_proj", n, h // t, h, d_proj, saved["context"],
                                     W("proj.weight"), G("proj.weight", "proj.bias"))
            d_probs, d_qkv, d_scores = self.act(b, a, s, s), self.act(s, b, 3 * h // t), self.act(b, a, s, s)
            self.gemm(p + "attn_context.bwd_probs", s, dh, s, batch=b * a, kind="bmm",
                      inputs=[d_context, saved["qkv"]], outputs=[d_probs])
            self.gemm(p + "attn_context.bwd_values", s, s, dh, batch=b * a, kind="bmm",
                      inputs=[d_context, saved["probs"]], outputs=[d_qkv])
            self.elementwise(p + "softmax.bwd", b * a * s * s, 2, [d_probs, saved["probs"]], [d_scores])
            self.gemm(p + "attn_scores.bwd_query", s, s, dh, batch=b * a, kind="bmm",
                      inputs=[d_scores, saved["qkv"]], outputs=[d_qkv])
            self.gemm(p + "attn_scores.bwd_key", s, s, dh, batch=b * a, kind="bmm",
                      inputs=[d_scores, saved["qkv"]], outputs=[d_qkv])
            d_ln1 = self.column_bwd(p + "qkv", n, h, 3 * h // t, d_qkv, saved["ln1"], saved["ln1_full"],
                                    W("qkv.weight"), G("qkv.weight", "qkv.bias"))
            d_x = self.act(sl, b, h)
            self.elementwise(p + "ln1.bwd", local * h, 2, [d_ln1, saved["x"], *W("ln1.weight", "ln1.bias"), d_x1],
                             [d_x, *G("ln1.weight", "ln1.bias")])
            grad = d_x
        if self.first:
            name = f"mb{mb}.embedding"
            if t > 1:
                grad = self.tp_in(name + ".bwd", grad)
            self.kernel(name + ".bwd", "embedding", n * h, 2 * n * h * cfg.e, [grad],
                        self.param_grads(None, "embedding.weight"))
        else:
            self.boundary[("grad_out", mb)] = grad

    # Schedule -------------------------------------------------------------------------------------------
    def run(self) -> list[pb.Node]:
        cfg = self.cfg
        dt = cfg.dp * cfg.tp
        prev = self.rank - dt if not self.first else None
        nxt = self.rank + dt if not self.last else None
        size = self.shard_bytes() if cfg.sp else self.act_bytes()
        io = self._boundary

        def recv_fwd(mb: int) -> P2POps:
            return [("recv", prev, 2 * mb, io("act_in", mb))] if prev is not None else []

        def send_fwd(mb: int) -> P2POps:
            return [("send", nxt, 2 * mb, io("act_out", mb))] if nxt is not None else []

        def recv_bwd(mb: int) -> P2POps:
            return [("recv", nxt, 2 * mb + 1, io("grad_in", mb))] if nxt is not None else []

        def send_bwd(mb: int) -> P2POps:
            return [("send", prev, 2 * mb + 1, io("grad_out", mb))] if prev is not None else []

        def comm(ops: P2POps) -> None:
            if ops:
                self.p2p(ops, size)

        m = cfg.m
        if cfg.schedule == "gpipe":
            for mb in range(m):
                comm(recv_fwd(mb))
                self.forward(mb)
                comm(send_fwd(mb))
            for mb in range(m):
                comm(recv_bwd(mb))
                self.backward(mb)
                comm(send_bwd(mb))
        else:   # 1F1B (PipeDream-Flush), as Megatron's forward_backward_pipelining_without_interleaving
            warmup = min(cfg.pp - self.stage - 1, m)
            steady = m - warmup
            fwd = bwd = 0
            for _ in range(warmup):
                comm(recv_fwd(fwd))
                self.forward(fwd)
                comm(send_fwd(fwd))
                fwd += 1
            if steady:
                comm(recv_fwd(fwd))
            for i in range(steady):
                self.forward(fwd)
                comm(send_fwd(fwd) + recv_bwd(bwd))
                fwd += 1
                self.backward(bwd)
                if i == steady - 1:
                    comm(send_bwd(bwd))
                else:
                    comm(send_bwd(bwd) + recv_fwd(fwd))
                bwd += 1
            for _ in range(warmup):
                comm(recv_bwd(bwd))
                self.backward(bwd)
                comm(send_bwd(bwd))
                bwd += 1
        self.finalize()
        return self.s.nodes

    def finalize(self) -> None:
        """Gradient synchronisation and the optimizer step, after the last micro-batch."""
        cfg = self.cfg
        h, ge = cfg.hidden, cfg.ge
        if cfg.sp and cfg.tp > 1:   # layer norms and row-parallel biases see only a sequence shard
            replicated = 6 * h * cfg.layers_per_stage + (2 * h if self.last else 0)
            grads = [g for layer in self._layers() for g in self.param_grads(
                layer, "ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias", "proj.bias", "fc2.bias")]
            if self.last:
                grads += self.param_grads(None, "final_ln.weight", "final_ln.bias")
            self.blocking("grads.tp_all_reduce_sequence_parallel", pb.ALL_REDUCE, replicated * ge,
                          self.groups.tp, grads, grads)
        if self.groups.emb is not None:
            grads = self.param_grads(None, "embedding.weight" if self.first else "lm_head.weight")
            self.blocking("grads.embedding_all_reduce", pb.ALL_REDUCE, cfg.vocab // cfg.tp * h * ge,
                          self.groups.emb, grads, grads)
        params = cfg.stage_params_per_rank(self.stage)
        updated, grad, weights = params, self.grad_buffer, self.weight_buffer
        if self.distributed:   # the buffer is padded to a multiple of dp; this rank updates its shard
            updated = self.shard
            grad = self.view(self.grad_buffer, self.dp_index * updated, (updated,))
            weights = self.view(self.weight_buffer, self.dp_index * updated, (updated,))
            self.blocking("grads.dp_reduce_scatter", pb.REDUCE_SCATTER, updated * cfg.dp * ge, self.groups.dp,
                          [self.grad_buffer], [grad])
        elif cfg.dp > 1:
            self.blocking("grads.dp_all_reduce", pb.ALL_REDUCE, params * ge, self.groups.dp,
                          [self.grad_buffer], [self.grad_buffer])
        self.kernel("optimizer", "optimizer", OPTIMIZER_OPS_PER_PARAM * updated,
                    updated * (OPTIMIZER_FP32_STATE_BYTES + ge + cfg.e),
                    [grad, *self.adam, weights], [*self.adam, weights])
        if self.distributed:
            self.blocking("params.dp_all_gather", pb.ALL_GATHER, updated * cfg.e, self.groups.dp,
                          [weights], [self.weight_buffer])


def transformer_traces(cfg: TransformerConfig) -> list[list[pb.Node]]:
    """One node list per rank (rank = stage x dp x tp + dp_index x tp + tp_index)."""
    return list(iter_transformer_traces(cfg))


def iter_transformer_traces(cfg: TransformerConfig) -> Iterator[list[pb.Node]]:
    """The node lists of `transformer_traces`, one rank at a time (memory: one rank's nodes)."""
    cfg.check()
    for rank in range(cfg.world):
        yield _TransformerRank(cfg, rank).run()


def transformer_metadata(cfg: TransformerConfig) -> pb.GlobalMetadata:
    fields = ("layers", "hidden", "heads", "seq", "batch", "vocab", "dtype", "dp", "tp", "pp", "sp",
              "schedule", "dp_reduce")
    attrs: dict[str, object] = {"generator": "chakra-sim generate transformer"}
    attrs.update({name: getattr(cfg, name) for name in fields})
    attrs.update({"microbatches": cfg.m, "ffn_hidden": cfg.f, "grad_dtype": cfg.grad_dtype or cfg.dtype})
    # the nominal device of duration_micros: a run that replays them on another GPU warns
    attrs.update({"peak_tflops": f"{cfg.peak_tflops:g}", "mem_bw_gbps": f"{cfg.mem_bw_gbps:g}"})
    return metadata(attrs)


def write_transformer(prefix: str | os.PathLike[str], cfg: TransformerConfig,
                      compress: bool = False) -> list[Path]:
    # Rank by rank: a 16,384-rank job never holds more than one rank's nodes.
    cfg.check()   # before the output folder is made
    return write_rank_files(prefix, iter_transformer_traces(cfg), transformer_metadata(cfg), compress=compress,
                            count=cfg.world, what="ranks (dp x tp x pp)")

