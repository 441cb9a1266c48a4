"""The generated GPT's configuration: model, parallelism, derived sizes and parameter counts.

docs/tools.md describes the model and how it is parallelised.
"""

from __future__ import annotations

from dataclasses import dataclass

from chakra_core.tools.generate.errors import GeneratorError

DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}
TENSOR_TYPES = {"fp16": "Tensor(c10::Half)", "bf16": "Tensor(c10::BFloat16)", "fp32": "Tensor(float)"}
"""Operand type strings as PyTorch execution traces write them."""
DEVICE = "cuda:0"
"""The device of generated tensors (each rank's own accelerator)."""
ADAM_STATES = ("master_weights", "exp_avg", "exp_avg_sq")
OPTIMIZER_OPS_PER_PARAM = 10
"""Adam with weight decay, per parameter: two moment updates, bias corrections, sqrt, divide, update."""
OPTIMIZER_FP32_STATE_BYTES = 24
"""Adam reads and writes the fp32 master weight and both moments: 3 x 4 bytes x 2 per parameter."""


@dataclass(frozen=True)
class TransformerConfig:
    """A Megatron-style GPT and how it is parallelised (see docs/tools.md)."""

    layers: int
    hidden: int
    heads: int
    seq: int
    batch: int                      # global batch, sequences per iteration
    vocab: int
    dtype: str = "bf16"
    dp: int = 1
    tp: int = 1
    pp: int = 1
    sp: bool = False
    microbatches: int | None = None     # per DP replica; default: pp
    ffn: int | None = None              # MLP hidden size; default 4 x hidden
    schedule: str = "1f1b"              # or "gpipe"
    dp_reduce: str = "allreduce"        # or "rs-ag" (distributed optimizer)
    grad_dtype: str | None = None       # default: dtype
    peak_tflops: float = 312.0          # for duration_micros estimates only
    mem_bw_gbps: float = 2039.0

    # Derived sizes ------------------------------------------------------------------------
    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def f(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def m(self) -> int:
        return self.microbatches or self.pp

    @property
    def micro_batch(self) -> int:
        return self.batch // (self.dp * self.m)

    @property
    def tokens(self) -> int:
        """Tokens per micro-batch: n = micro-batch size x sequence length."""
        return self.micro_batch * self.seq

    @property
    def e(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def ge(self) -> int:
        return DTYPE_BYTES[self.grad_dtype or self.dtype]

    @property
    def layers_per_stage(self) -> int:
        return self.layers // self.pp

    def problems(self) -> list[str]:
        out = []
        for name in ("layers", "hidden", "heads", "seq", "batch", "vocab", "dp", "tp", "pp"):
            if getattr(self, name) < 1:
                out.append(f"--{name} must be at least 1")
        if out:
            return out
        if self.dtype not in DTYPE_BYTES:
            out.append(f"--dtype {self.dtype!r}: expected one of {', '.join(DTYPE_BYTES)}")
        if self.grad_dtype is not None and self.grad_dtype not in DTYPE_BYTES:
            out.append(f"--grad-dtype {self.grad_dtype!r}: expected one of {', '.join(DTYPE_BYTES)}")
        if self.schedule not in ("1f1b", "gpipe"):
            out.append(f"--schedule {self.schedule!r}: expected 1f1b or gpipe")
        if self.dp_reduce not in ("allreduce", "rs-ag"):
            out.append(f"--dp-reduce {self.dp_reduce!r}: expected allreduce or rs-ag")
        if self.ffn is not None and self.ffn < 1:
            out.append("--ffn-hidden must be at least 1")
        if self.microbatches is not None and self.microbatches < 1:
            out.append("--microbatches must be at least 1")
        if self.hidden % self.heads:
            out.append(f"--hidden {self.hidden} is not divisible by --heads {self.heads}")
        if self.heads % self.tp:
            out.append(f"--heads {self.heads} is not divisible by --tp {self.tp}")
        if self.f % self.tp:
            out.append(f"the MLP hidden size {self.f} is not divisible by --tp {self.tp}")
        if self.vocab % self.tp:
            out.append(f"--vocab {self.vocab} is not divisible by --tp {self.tp} (Megatron pads the "
                       "vocabulary; pass the padded size)")
        if self.sp and self.seq % self.tp:
            out.append(f"--sp needs --seq {self.seq} divisible by --tp {self.tp}")
        if self.layers % self.pp:
            out.append(f"--layers {self.layers} is not divisible by --pp {self.pp}")
        if not out and self.batch % (self.dp * self.m):
            out.append(f"--batch {self.batch} is not divisible by --dp {self.dp} x {self.m} micro-batches"
                       + ("" if self.microbatches else " (the default is one per pipeline stage; "
                          "set --microbatches)"))
        if self.peak_tflops <= 0 or self.mem_bw_gbps <= 0:
            out.append("--peak-tflops and --mem-bw-gbps must be positive")
        return out + self._overflow()

    def _overflow(self) -> list[str]:
        """A layer larger than a trace's 64-bit sizes and counts hold, named by its largest factor."""
        if min(self.batch, self.seq, self.hidden, self.f, self.vocab) < 1:
            return []
        factors = {"--seq": self.seq, "--batch": self.batch, "--hidden": self.hidden, "--ffn-hidden": self.f,
                   "--vocab": self.vocab}
        rows = self.batch * self.seq
        for what, value in (("activation", rows * self.hidden * 4),
                            ("GEMM", 2 * rows * self.hidden * max(self.f, self.vocab)),
                            ("attention", 4 * rows * self.seq * self.hidden)):
            if value > (1 << 63) - 1:
                option = max(factors, key=lambda k: factors[k])
                unit = "bytes" if what == "activation" else "FLOPs"
                return [f"{option} {factors[option]}: a layer's {what} is {value:.2g} {unit}, more than the "
                        "2^63-1 a Chakra trace's 64-bit fields hold"]
        return []

    def check(self) -> None:
        problems = self.problems()
        if problems:
            raise GeneratorError("invalid transformer configuration:\n" +
                                 "\n".join(f"  {p}" for p in problems))

    # Parameters ---------------------------------------------------------------------------
    def layer_params_per_rank(self) -> int:
        """One transformer layer on one TP rank: QKV and fc1 split by columns (with their biases),
        proj and fc2 split by rows (biases replicated), two layer norms replicated."""
        h, f, t = self.hidden, self.f, self.tp
        return (3 * h * h + 3 * h) // t + h * h // t + h + (h * f + f) // t + f * h // t + h + 4 * h

    def stage_params_per_rank(self, stage: int) -> int:
        params = self.layers_per_stage * self.layer_params_per_rank()
        embedding = self.vocab // self.tp * self.hidden
        if stage == 0:
            params += embedding
        if stage == self.pp - 1:
            params += 2 * self.hidden                 # final layer norm
            if self.pp > 1:
                params += embedding                   # the LM head's copy of the tied embedding
        return params

    def model_params(self) -> int:
        """Parameters of the model (each counted once): what 6 x P x T counts."""
        h, f = self.hidden, self.f
        return self.layers * (4 * h * h + 2 * h * f + 9 * h + f) + self.vocab * h + 2 * h
