"""`chakra-sim generate transformer`: a front over the training-job generator for a GPT given by flags.

The flags become a job (`transformer_job`: an inline GPT shape, its parallel layout and batch)
that `generate job`'s writer turns into traces, so both commands write the same traces for the
same job. What the generator this replaced offered beyond jobs is refused with what to use
instead (`_refused`); docs/tools.md lists each option and what it became.
"""

from __future__ import annotations

import click

from chakra_core.cli.output import CliError
from chakra_core.errors import ManifestError
from chakra_core.jobs.expand import read_job
from chakra_core.json_types import JsonObject
from chakra_core.tools.generate.job import write_job_files

PROFILE = "h100-sxm-hgx"
"""A job names its cluster; the traces do not depend on it (only `where` the groups land, which
the command prints). `generate job --profile` chooses one."""

FLAGS = {"model.layers": "--layers", "model.hidden": "--hidden", "model.heads": "--heads",
         "model.ffn_hidden": "--ffn-hidden", "model.vocab": "--vocab", "training.seq": "--seq",
         "training.global_batch": "--batch", "training.micro_batch": "--batch / (--dp x --microbatches)",
         "parallel.tp": "--tp", "parallel.pp": "--pp", "cluster.gpus": "--dp x --tp x --pp"}
"""The job keys the flags set, to name the flag in a refused job's message."""


def transformer_job(layers: int, hidden: int, heads: int, seq: int, batch: int, vocab: int, dtype: str = "bf16",
                    dp: int = 1, tp: int = 1, pp: int = 1, sp: bool = False, microbatches: int | None = None,
                    ffn_hidden: int | None = None, dp_reduce: str = "allreduce",
                    grad_dtype: str | None = None) -> JsonObject:
    """The job (its `job:` section) the flags describe: Megatron-LM's GPT (pretrain_gpt.py's
    defaults: LayerNorm, GeLU MLP of 4 x hidden, linear biases, learned absolute positions, the
    output layer tied to the embedding), `batch` sequences per step in `microbatches` (default
    pp) micro-batches per data-parallel replica; every node lists its tensors, as before."""
    m = microbatches or pp
    if batch % (dp * m):
        raise CliError(f"--batch {batch} is not divisible by --dp {dp} x {m} micro-batches"
                       + ("" if microbatches else " (the default is one per pipeline stage; set --microbatches)"))
    training: JsonObject = {"seq": seq, "global_batch": batch, "micro_batch": batch // (dp * m),
                          "precision": dtype, "distributed_optimizer": dp_reduce == "rs-ag"}
    if grad_dtype is not None:
        training["grad_reduce_dtype"] = grad_dtype
    return {"model": {"layers": layers, "hidden": hidden, "ffn_hidden": ffn_hidden or 4 * hidden, "heads": heads,
                      "vocab": vocab, "max_seq": seq, "mlp": "gelu", "norm": "layernorm", "position": "learned",
                      "tied_embeddings": True, "bias": True},
            "parallel": {"tp": tp, "pp": pp, "sp": sp},
            "training": training,
            "cluster": {"gpus": dp * tp * pp, "profile": PROFILE},
            "tensors": True}


def _refused(dtype: str, schedule: str, grad_dtype: str | None, peak_tflops: float | None,
             mem_bw_gbps: float | None) -> list[str]:
    """Options of the replaced generator that a Megatron job does not have, and what to use instead."""
    out = []
    if dtype == "fp32":
        out.append("--dtype fp32: a job trains in mixed precision, bf16 or fp16 (generate job also fp8); "
                   "--grad-dtype fp32 keeps gradients in fp32")
    if schedule == "gpipe":
        # Megatron-LM's schedules (megatron/core/pipeline_parallel/schedules.py,
        # get_forward_backward_func) are 1F1B, interleaved or not; GPipe is not one of them
        out.append("--schedule gpipe: Megatron-LM has no GPipe schedule; it runs 1F1B (the default), or "
                   "interleaved 1F1B with generate job --vp N")
    if grad_dtype == "fp16":
        out.append("--grad-dtype fp16: a job reduces gradients in fp32 (Megatron's default) or bf16 "
                   "(--grad-reduce-in-bf16)")
    if peak_tflops is not None or mem_bw_gbps is not None:
        out.append("--peak-tflops / --mem-bw-gbps: the traces carry no duration estimates; a run's compute "
                   "layer times their kernels from num_ops and shapes (e.g. compute: {plugin: roofline, "
                   "profile: h100-sxm-hgx})")
    return out


def _with_flags(exc: ManifestError) -> str:
    """The job's problems, each named by the flag that sets the key it is at."""
    lines = []
    for where, why in exc.problems:
        key = where.rpartition(": ")[2].removeprefix("job.")
        lines.append(f"{FLAGS[key]} {why}" if key in FLAGS else why)
    return "\n".join(lines)


@click.command("transformer")
@click.option("--layers", required=True, type=click.IntRange(min=1), help="transformer layers (L)")
@click.option("--hidden", required=True, type=click.IntRange(min=1), help="hidden size (h)")
@click.option("--heads", required=True, type=click.IntRange(min=1), help="attention heads (a)")
@click.option("--seq", required=True, type=click.IntRange(min=1), help="sequence length (s)")
@click.option("--batch", required=True, type=click.IntRange(min=1), help="global batch in sequences per step (B)")
@click.option("--vocab", required=True, type=click.IntRange(min=1),
              help="vocabulary size (padded to a multiple of 128 x --tp, as Megatron does)")
@click.option("--dtype", default="bf16", show_default=True, type=click.Choice(["bf16", "fp16", "fp32"]),
              help="training precision (fp32: refused, see docs/tools.md)")
@click.option("--dp", default=1, show_default=True, type=click.IntRange(min=1), help="data-parallel replicas")
@click.option("--tp", default=1, show_default=True, type=click.IntRange(min=1), help="tensor-parallel ranks")
@click.option("--pp", default=1, show_default=True, type=click.IntRange(min=1), help="pipeline stages")
@click.option("--sp", is_flag=True, help="sequence parallelism (TP all-reduces become reduce-scatter + "
                                         "all-gather)")
@click.option("--microbatches", type=click.IntRange(min=1),
              help="micro-batches per replica and step [default: --pp]")
@click.option("--ffn-hidden", type=click.IntRange(min=1), help="MLP hidden size [default: 4 x --hidden]")
@click.option("--schedule", default="1f1b", show_default=True, type=click.Choice(["1f1b", "gpipe"]),
              help="pipeline schedule (gpipe: refused, Megatron has none)")
@click.option("--dp-reduce", default="allreduce", show_default=True, type=click.Choice(["allreduce", "rs-ag"]),
              help="gradient all-reduce, or reduce-scatter + all-gather (distributed optimizer)")
@click.option("--grad-dtype", type=click.Choice(["fp32", "bf16", "fp16"]),
              help="type gradients are reduced in [default: fp32, as Megatron; fp16 refused]")
@click.option("--peak-tflops", type=float, hidden=True)
@click.option("--mem-bw-gbps", type=float, hidden=True)
@click.option("--output", required=True, metavar="PREFIX", help="writes PREFIX.<rank>.et")
@click.option("--compress", is_flag=True, help="gzip the .et files")
def transformer(layers: int, hidden: int, heads: int, seq: int, batch: int, vocab: int, dtype: str, dp: int, tp: int,
                pp: int, sp: bool, microbatches: int | None, ffn_hidden: int | None, schedule: str, dp_reduce: str,
                grad_dtype: str | None, peak_tflops: float | None, mem_bw_gbps: float | None, output: str,
                compress: bool) -> None:
    """A Megatron-LM GPT training step given by its shape, one trace per rank.

    A front over `generate job`: the flags become a job (an inline GPT shape, tp, pp, dp, sp,
    micro-batches, precision) whose traces `generate job` writes the same. `generate job` also
    gives model presets, context and virtual pipeline parallelism, fp8, recomputation, the
    attention kernels, GQA/SwiGLU/RMSNorm shapes and every job key (--set); docs/training.md.

    Ranks are numbered tensor-parallel first, then data-parallel, then pipeline stage:
    rank = stage x dp x tp + replica x tp + tp_index.

    \b
    Example (GPT-2 medium on 16 GPUs: TP 2 with SP, PP 2, DP 4):
      chakra-sim generate transformer --layers 24 --hidden 1024 --heads 16 \\
                 --seq 1024 --batch 64 --vocab 50257 --dtype bf16 \\
                 --dp 4 --tp 2 --pp 2 --sp --microbatches 8 --output traces/gpt
    """
    refused = _refused(dtype, schedule, grad_dtype, peak_tflops, mem_bw_gbps)
    if refused:
        raise CliError("\n".join(refused))
    data = transformer_job(layers, hidden, heads, seq, batch, vocab, dtype, dp, tp, pp, sp, microbatches, ffn_hidden,
                           dp_reduce, grad_dtype)
    try:
        read_job(data, "generate transformer")
    except ManifestError as exc:
        raise CliError(_with_flags(exc)) from None
    write_job_files(data, "generate transformer", output, compress=compress)
