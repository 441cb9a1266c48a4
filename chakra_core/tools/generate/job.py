"""`chakra-sim generate job`: a training job's traces, every rank, from a job file or options."""

from __future__ import annotations

from pathlib import Path

import click
import yaml

from chakra_core._atomic import atomic_write_text
from chakra_core.cli.output import CliError, tool_errors
from chakra_core.config.files import read_config_file
from chakra_core.errors import ManifestError
from chakra_core.jobs.domains import job_gpus_per_node
from chakra_core.jobs.expand import job_profile, read_job, write_job
from chakra_core.jobs.flops import formulas, model_flops
from chakra_core.jobs.models import preset, presets
from chakra_core.jobs.optimizer_offload import host_optimizer
from chakra_core.jobs.placement import Placement
from chakra_core.jobs.rank_writer import default_workers
from chakra_core.json_types import JsonObject, JsonValue
from chakra_core.sweep.paths import KeyPathError, parse_key_path, set_key_path


@click.command("job")
@click.argument("job_file", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--model", help="a model preset (--list-models)")
@click.option("--list-models", is_flag=True, help="list the model presets with their sources and exit")
@click.option("--gpus", type=click.IntRange(min=1), help="GPUs in the job")
@click.option("--profile", help="hardware profile of the cluster (chakra-sim profiles)")
@click.option("--gpus-per-node", type=click.IntRange(min=1), help="default: the profile's")
@click.option("--tp", type=click.IntRange(min=1), help="tensor parallel size")
@click.option("--pp", type=click.IntRange(min=1), help="pipeline stages")
@click.option("--vp", type=click.IntRange(min=1), help="model chunks per stage (interleaved 1F1B)")
@click.option("--cp", type=click.IntRange(min=1), help="context parallel size")
@click.option("--seq", type=click.IntRange(min=1), help="sequence length")
@click.option("--global-batch", type=click.IntRange(min=1), help="sequences per step")
@click.option("--micro-batch", type=click.IntRange(min=1), help="sequences per micro-batch")
@click.option("--precision", type=click.Choice(["bf16", "fp16", "fp8", "nvfp4"]))
@click.option("--recompute", type=click.Choice(["none", "selective", "full"]))
@click.option("--fp8-recipe", type=click.Choice(["delayed", "current", "mxfp8"]), help="fp8 scaling")
@click.option("--attention", type=click.Choice(["flash", "unfused"]))
@click.option("--sp/--no-sp", default=None, help="sequence parallelism (default: on when tp > 1)")
@click.option("--tp-comm-overlap/--no-tp-comm-overlap", default=None,
              help="Transformer Engine's userbuffers overlap TP communication with GEMMs")
@click.option("--distributed-optimizer/--no-distributed-optimizer", default=None,
              help="shard optimizer state over data-parallel ranks (default: on)")
@click.option("--model-file", type=click.Path(dir_okay=False, path_type=Path),
              help="an inline model shape (YAML: layers, hidden, ffn_hidden, heads, ...) instead of --model")
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE",
              help="any job key by its path, e.g. training.overlap_grad_reduce=false or model.mlp=gelu "
                   "(repeatable; docs/manifest.md lists the keys)")
@click.option("--output", metavar="PREFIX", help="writes PREFIX.<rank>.et")
@click.option("--save-job", type=click.Path(dir_okay=False, path_type=Path),
              help="also write the job description (YAML, a `job:` section for chakra-sim run)")
def job(job_file: Path | None, model: str | None, list_models: bool, gpus: int | None, profile: str | None,
        gpus_per_node: int | None, tp: int | None, pp: int | None, vp: int | None, cp: int | None,
        seq: int | None, global_batch: int | None, micro_batch: int | None, precision: str | None,
        recompute: str | None, fp8_recipe: str | None, attention: str | None, sp: bool | None,
        tp_comm_overlap: bool | None, distributed_optimizer: bool | None, model_file: Path | None,
        settings: tuple[str, ...], output: str | None, save_job: Path | None) -> None:
    """A Megatron-LM training step, one trace per rank (docs/training.md).

    Give a job file (its `job:` section, as `chakra-sim run` reads it) and/or options; options
    override the file, and --set reaches every job key. To simulate a job, `chakra-sim run` a job
    manifest instead: it generates one rank per pipeline stage only.

    \b
    Example (Llama 3 70B on 64 H100: TP 4, PP 4, VP 5, CP 2, FP8):
      chakra-sim generate job --model llama3-70b --gpus 64 --profile h100-hgx-ndr400 \\
          --tp 4 --pp 4 --vp 5 --cp 2 --seq 8192 --global-batch 128 --precision fp8 \\
          --output traces/llama3-70b
    """
    if list_models:
        for name, shape in sorted(presets().items()):
            experts = (f", {shape.num_experts} experts (top {shape.router_topk}), {shape.active_params():,} active"
                       if shape.moe else "")
            click.echo(f"{name}: {shape.layers} layers, hidden {shape.hidden}, {shape.heads} heads "
                       f"({shape.groups} kv), {shape.params():,} parameters{experts}; {shape.source}")
        return
    data: JsonObject = {}
    if job_file is not None:
        with tool_errors(str(job_file)):
            raw = read_config_file(job_file)
        job_section = raw.get("job", raw)
        if not isinstance(job_section, dict):
            raise CliError(f"{job_file}: job: a mapping of the job's keys (docs/training.md)")
        data = dict(job_section)
    if model is not None and model_file is not None:
        raise CliError("give --model (a preset) or --model-file (a shape), not both")
    _override(data, None, "model", model)
    if model_file is not None:
        with tool_errors(str(model_file)):
            shape_file = read_config_file(model_file)
        data["model"] = shape_file.get("model", shape_file)
    for section, key, value in (("parallel", "tp", tp), ("parallel", "pp", pp), ("parallel", "vp", vp),
                                ("parallel", "cp", cp), ("parallel", "sp", sp),
                                ("parallel", "tp_comm_overlap", tp_comm_overlap), ("training", "seq", seq),
                                ("training", "global_batch", global_batch), ("training", "micro_batch", micro_batch),
                                ("training", "precision", precision), ("training", "recompute", recompute),
                                ("training", "fp8_recipe", fp8_recipe), ("training", "attention", attention),
                                ("training", "distributed_optimizer", distributed_optimizer),
                                ("cluster", "gpus", gpus), ("cluster", "profile", profile),
                                ("cluster", "gpus_per_node", gpus_per_node)):
        _override(data, section, key, value)
    for setting in settings:
        _set(data, setting)
    if output is None and save_job is None:
        raise CliError("give --output PREFIX (traces) and/or --save-job FILE (the job description)")
    write_job_files(data, str(job_file or "options"), output, save_job)


def write_job_files(data: JsonObject, source: str, output: str | None, save_job: Path | None = None,
                    compress: bool = False) -> None:
    """Validate the job `data` (its `job:` section) and write its description and/or traces,
    saying what was written; `generate job` and its front `generate transformer` end here."""
    try:
        spec = read_job(data, source)
    except ManifestError as exc:
        raise CliError(str(exc)) from None
    try:   # as `run` says it: the file and key that name the profile or the precision
        profile = job_profile(spec.cluster.profile, spec.training.precision, Path("."), source, spec.training.fp8_recipe)
    except ManifestError as exc:
        raise CliError(str(exc)) from None
    try:
        host = host_optimizer(spec, profile, source)
    except ManifestError as exc:
        raise CliError(str(exc)) from None
    placement = Placement(spec, job_gpus_per_node(spec.cluster, profile), profile.gpu.architecture, host)
    if save_job is not None:
        with tool_errors(str(save_job)):
            atomic_write_text(save_job, yaml.safe_dump({"job": data}, sort_keys=False))
        click.echo(f"wrote {save_job}")
    if output is not None:
        with tool_errors(f"{output}.<rank>.et"):
            files = write_job(spec, placement, Path(output), compress=compress, workers=default_workers())
        click.echo(f"{placement.world} ranks (tp {spec.parallel.tp} x cp {spec.parallel.cp} x dp {spec.dp} x pp "
                   f"{spec.parallel.pp}, vp {spec.vp}), {spec.microbatches} micro-batch(es) per replica; "
                   f"{model_flops(spec, formulas(spec)[0]):.4g} model FLOPs per step")
        for row in placement.where():
            click.echo(f"  {row.group}: {row.ranks} ranks on {row.nodes} node(s), "
                       f"{row.gpus_per_node} per node ({row.fabric})")
        click.echo(f"wrote {files[0]} ... {files[-1]}" if len(files) > 1 else f"wrote {files[0]}")


def _set(data: JsonObject, setting: str) -> None:
    """--set training.overlap_grad_reduce=false: the value read as YAML, placed at its key path
    (the sweep's key paths, relative to `job:`)."""
    key, sep, text = setting.partition("=")
    try:
        path = parse_key_path(key.strip().removeprefix("job."))
    except KeyPathError as exc:
        raise CliError(f"--set {setting}: {exc}") from None
    if not sep:
        raise CliError(f"--set {setting}: expected KEY=VALUE with KEY a job key's path, "
                       "e.g. training.overlap_grad_reduce=false")
    value: JsonValue
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        value = text
    model = data.get("model")
    if path[0] == "model" and len(path) > 1 and isinstance(model, str):
        # Changing one key of a preset: start from the preset's shape.
        try:
            data["model"] = preset(model).model_dump(exclude={"name"})
        except ValueError as exc:
            raise CliError(f"--set {setting}: {exc}") from None
    try:
        set_key_path(data, path, value)
    except KeyPathError as exc:
        raise CliError(f"--set {setting}: {exc}") from None


def _override(data: JsonObject, section: str | None, key: str, value: JsonValue) -> None:
    if value is None:
        return
    target = data if section is None else data.setdefault(section, {})
    if not isinstance(target, dict):
        raise CliError(f"job.{section}: a mapping of keys in the job file, not {target!r}")
    target[key] = value
