"""The `chakra-sim generate` command group: `microbenchmark`, `transformer` and `job`."""

from __future__ import annotations

import click

from chakra_core.cli.output import tool_errors
from chakra_core.tools.generate.job import job
from chakra_core.tools.generate.microbenchmark import COLLECTIVES, P2P_PATTERNS, write_microbenchmark
from chakra_core.tools.generate.transformer import write_transformer
from chakra_core.tools.generate.transformer_config import DTYPE_BYTES, TransformerConfig


@click.group("generate")
def generate() -> None:
    """Generate synthetic Chakra traces (collective microbenchmarks, transformer training, training jobs)."""


generate.add_command(job)


@generate.command("microbenchmark")
@click.option("--collective", required=True, type=click.Choice([*COLLECTIVES, "send_recv"]),
              help="the operation every rank runs")
@click.option("--size", type=click.IntRange(min=0), metavar="BYTES",
              help="comm_size in bytes, as docs/collectives.md defines it per type (each rank's input; "
                   "scatter: the piece each rank receives); not for barrier")
@click.option("--npus", required=True, type=click.IntRange(min=1), help="number of ranks")
@click.option("--iterations", default=1, show_default=True, type=click.IntRange(min=1),
              help="back-to-back repetitions on every rank")
@click.option("--root", default=0, show_default=True, type=click.IntRange(min=0),
              help="root rank of broadcast/reduce/gather/scatter")
@click.option("--pattern", default="ring", show_default=True, type=click.Choice(P2P_PATTERNS),
              help="send_recv: ring shift, pairwise exchange (2i <-> 2i+1), or all-pairs (N-1 rounds)")
@click.option("--shift", default=1, show_default=True, type=int, help="send_recv ring: send to rank + SHIFT")
@click.option("--output", required=True, metavar="PREFIX", help="writes PREFIX.<rank>.et")
@click.option("--compress", is_flag=True, help="gzip the .et files")
def microbenchmark(collective: str, size: int | None, npus: int, iterations: int, root: int, pattern: str, shift: int,
                   output: str, compress: bool) -> None:
    """A collective (or point-to-point) microbenchmark, one trace per rank.

    With one iteration the collective files are identical to ASTRA-sim's
    examples/workload/microbenchmarks.

    \b
    Examples:
      chakra-sim generate microbenchmark --collective all_reduce --size 1048576 \\
                 --npus 8 --output traces/all_reduce
      chakra-sim generate microbenchmark --collective send_recv --pattern pairwise \\
                 --size 65536 --npus 8 --iterations 4 --output traces/p2p
    """
    with tool_errors(f"{output}.<rank>.et"):
        files = write_microbenchmark(output, collective, size, npus, iterations, root, pattern, shift,
                                     compress)
    click.echo(f"wrote {files[0]} ... {files[-1]}" if len(files) > 1 else f"wrote {files[0]}")


@generate.command("transformer")
@click.option("--layers", required=True, type=int, help="transformer layers (L)")
@click.option("--hidden", required=True, type=int, help="hidden size (h)")
@click.option("--heads", required=True, type=int, help="attention heads (a)")
@click.option("--seq", required=True, type=int, help="sequence length (s)")
@click.option("--batch", required=True, type=int, help="global batch in sequences per iteration (B)")
@click.option("--vocab", required=True, type=int, help="vocabulary size (V; divisible by --tp)")
@click.option("--dtype", default="bf16", show_default=True, type=click.Choice(list(DTYPE_BYTES)),
              help="activation and parameter type")
@click.option("--dp", default=1, show_default=True, type=int, help="data-parallel replicas")
@click.option("--tp", default=1, show_default=True, type=int, help="tensor-parallel ranks")
@click.option("--pp", default=1, show_default=True, type=int, help="pipeline stages")
@click.option("--sp", is_flag=True, help="sequence parallelism (TP all-reduces become reduce-scatter + "
                                         "all-gather)")
@click.option("--microbatches", type=int, help="micro-batches per replica and iteration [default: --pp]")
@click.option("--ffn-hidden", type=int, help="MLP hidden size [default: 4 x --hidden]")
@click.option("--schedule", default="1f1b", show_default=True, type=click.Choice(["1f1b", "gpipe"]),
              help="pipeline schedule")
@click.option("--dp-reduce", default="allreduce", show_default=True,
              type=click.Choice(["allreduce", "rs-ag"]),
              help="gradient all-reduce, or reduce-scatter + all-gather (distributed optimizer)")
@click.option("--grad-dtype", type=click.Choice(list(DTYPE_BYTES)),
              help="type of the reduced gradients [default: --dtype]")
@click.option("--peak-tflops", default=312.0, show_default=True, type=float,
              help="nominal device for duration_micros (a replay fallback; the roofline plugin uses "
                   "num_ops / tensor_size instead)")
@click.option("--mem-bw-gbps", default=2039.0, show_default=True, type=float,
              help="nominal device memory bandwidth, GB/s (10^9 B/s)")
@click.option("--output", required=True, metavar="PREFIX", help="writes PREFIX.<rank>.et")
@click.option("--compress", is_flag=True, help="gzip the .et files")
def transformer(layers: int, hidden: int, heads: int, seq: int, batch: int, vocab: int, dtype: str, dp: int, tp: int,
                pp: int, sp: bool, microbatches: int | None, ffn_hidden: int | None, schedule: str, dp_reduce: str,
                grad_dtype: str | None, peak_tflops: float, mem_bw_gbps: float, output: str, compress: bool) -> None:
    """One training iteration of a Megatron-style GPT, one trace per rank.

    Ranks are numbered tensor-parallel first, then data-parallel, then
    pipeline stage: rank = stage x dp x tp + replica x tp + tp_index.

    \b
    Example (GPT-2 medium on 16 GPUs: TP 2 with SP, PP 2, DP 4):
      chakra-sim generate transformer --layers 24 --hidden 1024 --heads 16 \\
                 --seq 1024 --batch 64 --vocab 50304 --dtype bf16 \\
                 --dp 4 --tp 2 --pp 2 --sp --microbatches 8 --output traces/gpt
    """
    cfg = TransformerConfig(layers=layers, hidden=hidden, heads=heads, seq=seq, batch=batch, vocab=vocab,
                            dtype=dtype, dp=dp, tp=tp, pp=pp, sp=sp, microbatches=microbatches,
                            ffn=ffn_hidden, schedule=schedule, dp_reduce=dp_reduce, grad_dtype=grad_dtype,
                            peak_tflops=peak_tflops, mem_bw_gbps=mem_bw_gbps)
    with tool_errors(f"{output}.<rank>.et"):
        files = write_transformer(output, cfg, compress)
    params = cfg.model_params()
    tokens = cfg.batch * cfg.seq
    click.echo(f"{cfg.world} ranks (dp {dp} x tp {tp} x pp {pp}{', sp' if sp else ''}), {cfg.m} "
               f"micro-batch(es) of {cfg.micro_batch} sequence(s) per replica, {schedule}")
    click.echo(f"model: {params:,} parameters; 6 x parameters x tokens = {6 * params * tokens:.4g} FLOPs "
               f"per iteration ({tokens:,} tokens)")
    click.echo(f"wrote {files[0]} ... {files[-1]}" if len(files) > 1 else f"wrote {files[0]}")
