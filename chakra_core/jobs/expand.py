"""A job manifest (`job:` instead of `workload.trace`) -> the traces and settings of a run.

The traces are generated into `<output dir>/traces/` (reused while the job is unchanged). Ranks
of one pipeline stage run the same program up to rank ids, so with `workload.fold: auto` only
one rank per stage is generated and simulated, the classes known by construction
(Placement.representative); `fold: off` generates and simulates every rank. A job names its
compute and system layers; those that need a hardware profile, or take GPUs per node, get the
cluster's unless they say.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from pydantic import ValidationError

from chakra_core.config.build import build_config
from chakra_core.config.manifest import LAYER_DEFAULTS, fold_setting, validation_problems
from chakra_core.config.spec import RunConfig
from chakra_core._version import __version__
from chakra_core.contract.folding import Folding
from chakra_core.errors import ManifestError, PluginError
from chakra_core.output_lock import OutputLock
from chakra_core.plugins import PluginHost
from chakra_core.hardware.profiles import Profile, load_profile
from chakra_core.jobs.flops import formulas, model_flops
from chakra_core.jobs.fp8 import gemm_dtype, precision_problems
from chakra_core.jobs.hybrid_ep import hybridep_problem
from chakra_core.jobs.info import JobInfo
from chakra_core.jobs.offload import offload_memory_defaults
from chakra_core.jobs.optimizer_offload import host_optimizer
from chakra_core.jobs.placement import Placement
from chakra_core.jobs.program import RankProgram
from chakra_core.jobs.rank_writer import GenerationProgress, RankFilesTask, write_ranks
from chakra_core.feeder import written
from chakra_core.jobs.time_fold import (RETRY_STEADY_PERIODS, period_microbatches, rank_periods, reach, reduced_job,
                                        simulated_microbatches, steady_periods)
from chakra_core.contract.time_folding import RankPeriods, TimeFolding, unsafe_layers
from chakra_core.jobs.overflow import overflow
from chakra_core.jobs.spec import JobSpec
from chakra_core.jobs.domains import domain_note, job_gpus_per_node
from chakra_core.limits import RANKS
from chakra_core.et.build import metadata, rank_path
from chakra_core.et.rank_files import RankFiles
from chakra_core.json_types import JsonObject

GENERATOR = "chakra-sim job"


@dataclass
class JobRun:
    """What a job manifest becomes: a plain manifest, its traces and what the report needs."""

    manifest: JsonObject
    traces: list[Path]
    folding: Folding | None
    info: JobInfo
    trace_prefix: Path
    """The traces' `<prefix>` (workload.trace): `<prefix>.<rank>.et` in the output folder's traces/."""
    time_folding: TimeFolding | None = None
    """The traces keep fewer micro-batches than the step (chakra_core.jobs.time_fold)."""
    time_fold_note: str = ""
    """Why they keep every micro-batch ("" when they do not, or workload.fold_time is off)."""
    reused: bool = False
    """The traces were already in the output folder, written for this job by this generator."""
    lock: OutputLock | None = None
    """The output folder's, taken before the traces were written (RunConfig.output_lock)."""
    memory_defaults: JsonObject = field(default_factory=dict)
    """Keys the memory layer gets where its config takes them and the job does not say (offload)."""
    unfolded_traces: Callable[[], list[Path]] | None = None
    """With `folding`: writes every rank's traces of the whole step (RunSpec.unfolded_traces)."""


def read_job(data: Any, source: str, base_dir: Path | None = None) -> JobSpec:
    """The validated job; files it names (a routing histogram) relative to `base_dir` (default the
    current folder)."""
    try:
        job = JobSpec.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as exc:
        raise ManifestError(validation_problems(exc, ("job",), source, JobSpec)) from None
    too_large = overflow(job)
    if too_large is not None:
        raise ManifestError([(f"{source}: {too_large[0]}", too_large[1])])
    refused = precision_problems(job)
    if refused:
        raise ManifestError([(f"{source}: {key}", why) for key, why in refused])
    if job.cluster.gpus > RANKS.value():   # before the placement, folding and per-rank results
        raise ManifestError([(f"{source}: job.cluster.gpus", f"{job.cluster.gpus:,} GPUs: more ranks than one "
                              f"run simulates; {RANKS.hint()}")])
    return job


def job_profile(name: str, precision: str, base_dir: Path, source: str, fp8_recipe: str | None = None) -> Profile:
    """The job's hardware profile, which must give a peak for the job's precision (its MFU and
    its kernels' rates are against it) and, under the mxfp8 recipe, for MXFP8: a ManifestError at
    the key that is wrong otherwise."""
    try:
        profile = load_profile(name, base_dir)
    except ManifestError as exc:
        raise ManifestError([(f"{source}: job.cluster.profile", f"{where}: {why}") for where, why in exc.problems]) \
            from None
    if precision not in profile.gpu.peak_tflops:
        runs = [dtype for dtype in ("bf16", "fp16", "fp8") if dtype in profile.gpu.peak_tflops]
        raise ManifestError([(f"{source}: job.training.precision",
                              f"{precision} on profile '{profile.name}': its GPU ({profile.gpu.model}) has no "
                              f"{precision} peak, so it does not run {precision} GEMMs; use "
                              f"{' or '.join(runs) or 'another precision'}, or a profile whose GPU runs {precision}")])
    if precision == "fp8" and fp8_recipe == "mxfp8" and "mxfp8" not in profile.gpu.peak_tflops:
        raise ManifestError([(f"{source}: job.training.fp8_recipe",
                              f"mxfp8 on profile '{profile.name}': its GPU ({profile.gpu.model}) has no mxfp8 peak "
                              "(MXFP8's block-scaled GEMMs need Blackwell tensor cores, and Transformer Engine runs "
                              "the recipe on Blackwell only); use fp8_recipe current or delayed, or a Blackwell profile")])
    return profile


def _profile_problems(raw: object, known: Sequence[tuple[str, str]], base_dir: Path,
                      source: str) -> list[tuple[str, str]]:
    """The job's profile's problems, when the job's own did not already name it."""
    cluster = raw.get("cluster") if isinstance(raw, Mapping) else None
    name = cluster.get("profile") if isinstance(cluster, Mapping) else None
    if not isinstance(name, str) or any("cluster.profile" in where for where, _ in known):
        return []
    try:
        load_profile(name, base_dir)
    except ManifestError as exc:
        return [(f"{source}: job.cluster.profile", f"{where}: {why}") for where, why in exc.problems]
    return []


def expand_job(data: Mapping[str, Any], base_dir: Path, source: str, out_dir: str | Path | None,
               progress: GenerationProgress | None = None, time_fold_refusal: str = "", workers: int = 1) -> JobRun:
    """The job's traces (written in up to `workers` processes) and settings; unless
    `time_fold_refusal` says why not (or workload.fold_time is off), the traces of fewer
    micro-batches when the step repeats (time_fold.py)."""
    raw = data.get("job")
    if isinstance(raw, Mapping) and "cluster" not in raw and "cluster" in data:
        raw = {**raw, "cluster": data["cluster"]}
    try:
        job = read_job(raw, source, base_dir)
    except ManifestError as exc:   # a wrong profile too, in the same message
        raise ManifestError([*exc.problems, *_profile_problems(raw, exc.problems, base_dir, source)]) from None
    profile = job_profile(job.cluster.profile, job.training.precision, base_dir, source, job.training.fp8_recipe)
    gpn = job_gpus_per_node(job.cluster, profile)
    if job.cluster.gpus > gpn and profile.network is None and not isinstance(data.get("network"), Mapping):
        # before a trace is written: the nodes would have nothing between them
        raise ManifestError([(f"{source}: job.cluster.gpus", f"{job.cluster.gpus} GPUs, but profile '{profile.name}' "
                              f"describes one node of {gpn} GPUs and no network between nodes: choose a "
                              "scale-out profile (chakra-sim profiles lists them), or give a network layer")])
    domains = hybridep_problem(job, gpn)
    if domains:
        raise ManifestError([(f"{source}: job.parallel.ep", domains)])
    placement = Placement(job, gpn, profile.gpu.architecture, host_optimizer(job, profile, source))
    output = dict(data.get("output") or {})
    if out_dir is not None:
        output["dir"] = str(out_dir)
    folder = Path(output.get("dir", "results"))
    folder = folder if folder.is_absolute() else base_dir / folder
    workload = dict(data.get("workload") or {})
    unknown = sorted(set(workload) - {"fold", "fold_time", "feeder", "cache_nodes"})
    if unknown:
        raise ManifestError([(f"{source}: workload.{unknown[0]}", "a job generates its traces; workload takes "
                              "only fold, fold_time, feeder and cache_nodes")])
    if "fold" in workload:
        workload["fold"] = fold_setting(workload["fold"])
    fold_time = fold_setting(workload.pop("fold_time", "auto"))
    if fold_time not in ("auto", "off"):
        raise ManifestError([(f"{source}: workload.fold_time", f"{fold_time!r}: 'auto' (simulate the micro-batches "
                              "that repeat once and add the rest, exactly) or 'off' (simulate every micro-batch)")])
    folded = workload.get("fold", "auto") == "auto" and not output.get("timeline", False)
    ranks = placement.representatives if folded else list(range(placement.world))
    representative = [placement.representative(r) for r in range(placement.world)]

    def traces_of(generated: Sequence[Path]) -> list[Path]:
        # a folded run opens only representatives' files: the others' entries name their representative's
        path_of = dict(zip(ranks, generated))
        return [path_of.get(rank) or path_of[representative[rank]] for rank in range(placement.world)]

    def whole_step() -> list[str]:
        return [str(path) for path in traces_of(_generate(job, placement, folder / "traces", ranks, progress,
                                                          workers=workers)[0])]

    kept, note = simulated_microbatches(job)
    if time_fold_refusal or output.get("timeline"):
        kept, note = job.microbatches, time_fold_refusal or "a timeline records every node"
    if fold_time == "off":
        kept, note = job.microbatches, ""

    def time_folded(kept: int, steady: int) -> tuple[TimeFolding | None, list[Path], bool]:
        """The step's traces with `kept` micro-batches, and where each rank's repeats (None: a
        rank's pairs do not repeat node for node)."""
        periods: dict[int, RankPeriods | None] = {}
        traces, reused = _generate(reduced_job(job, kept), placement, folder / "traces" / "time-folded", ranks,
                                   progress, periods, workers)
        if not all(periods.get(rank) is not None for rank in ranks):
            return None, traces, reused
        per_period = period_microbatches(job)
        return TimeFolding((job.microbatches - kept) // per_period, job.microbatches, kept, per_period,
                           {rank: span for rank, span in periods.items() if span is not None}, whole_step,
                           steady, lambda cycle: retry(steady, cycle)), traces, reused

    def retry(steady: int, cycle: int) -> tuple[TimeFolding, list[str]] | None:
        """After `steady` steady periods showed no instant repeat: the same steady periods with a
        multiple of the cycle they showed left out, or more of them to see a longer cycle (room for
        one as long as the pipeline: Llama 3.1 405B on H100 without interleaving, CP 2, repeats
        every pp - 2 micro-batches with PP 8 and 16); worth trying before the whole step while it
        keeps at most half of its micro-batches."""
        if not cycle:
            if steady >= RETRY_STEADY_PERIODS:
                return None
            steady, cycle = max(RETRY_STEADY_PERIODS, job.parallel.pp + 2), 2
        again, _ = simulated_microbatches(job, steady, cycle)
        if again > job.microbatches // 2:
            return None
        found, traces, _ = time_folded(again, steady)
        return None if found is None else (found, [str(path) for path in traces_of(traces)])

    time_folding = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = OutputLock(folder)   # before the traces: another run's would replace them under it
        lock.acquire()
        if kept < job.microbatches:
            time_folding, traces, reused = time_folded(kept, steady_periods(job))
            if time_folding is None:
                note = "a rank's forward/backward pairs do not repeat node for node"
        if time_folding is None:
            traces, reused = _generate(job, placement, folder / "traces", ranks, progress, workers=workers)
    except OSError as exc:
        raise ManifestError([(f"{source}: output.dir", f"cannot write the job's traces in {folder / 'traces'}: "
                              f"{exc.strerror or exc}")]) from None
    trace_files = traces_of(traces)
    folding = None
    if folded and placement.world > len(ranks):
        groups_of = [tuple(placement.groups(r).values()) for r in range(placement.world)]
        folding = Folding.of(representative, groups_of, placement.cp_rings)
    trace_prefix = folder / "traces" / job.name
    manifest: JsonObject = {
        "workload": {"trace": str(trace_prefix), "ranks": placement.world,
                     "resources": {"comm": None}, **workload},
        "output": output,
    }
    for layer in LAYER_DEFAULTS:
        if data.get(layer) is not None:
            manifest[layer] = data[layer]
    memory_defaults = offload_memory_defaults(job, data.get("memory"), profile, source)
    info = JobInfo(job, placement.world, gpn, job.dp, job.microbatches, job.training.global_batch * job.training.seq,
                   {formula: model_flops(job, formula) for formula in formulas(job)}, placement.where(),
                   profile.peak_flops(gemm_dtype(job.training)) / 1e12, profile.name, profile.gpu.model,
                   profile.gpu.architecture, job.cluster.profile, domain_note(job.cluster, profile))
    def every_rank() -> list[Path]:
        """Every rank's traces of the whole step, for a folded run that cannot fold after all."""
        return _generate(job, placement, folder / "traces", list(range(placement.world)), workers=workers)[0]

    return JobRun(manifest, trace_files, folding, info, trace_prefix, time_folding, note, reused, lock, memory_defaults,
                  every_rank if folding is not None else None)


@lru_cache(maxsize=1)
def generator_digest() -> str:
    """A digest of the generator's own source: traces cached by an older generator are rebuilt."""
    sources = sorted(Path(__file__).parent.glob("*.py"))
    return hashlib.sha256(b"".join(path.read_bytes() for path in sources)).hexdigest()


def _generate(job: JobSpec, placement: Placement, folder: Path, ranks: list[int],
              progress: GenerationProgress | None = None,
              periods: dict[int, RankPeriods | None] | None = None, workers: int = 1) -> tuple[list[Path], bool]:
    """Write the ranks' traces (in up to `workers` processes) unless the folder holds them for this
    very job, written by this very release and generator, already; the paths and whether they were
    reused. With `periods`, fill it with where each rank's trace repeats (kept beside the traces)."""
    host = placement.host_optimizer if job.training.optimizer_offload_fraction else None   # what it changes
    digest = hashlib.sha256(json.dumps([GENERATOR, __version__, generator_digest(), job.model_dump(mode="json"),
                                        placement.gpus_per_node, placement.architecture, ranks,
                                        *([] if host is None else [[host.ns_per_param, host.call_us]])],
                                       sort_keys=True).encode()).hexdigest()
    stamp = folder / f"{job.name}.job.sha256"
    spans = folder / f"{job.name}.periods.json"
    paths = [rank_path(folder / job.name, rank) for rank in ranks]
    if stamp.exists() and stamp.read_text() == digest and all(p.exists() for p in paths) and \
            (periods is None or spans.exists()):
        if periods is not None:
            periods.update({int(rank): None if span is None else RankPeriods(*span)
                            for rank, span in json.loads(spans.read_text()).items()})
        return paths, True
    folder.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)

    def periods_of(rank: int, program: RankProgram) -> RankPeriods | None:
        span = rank_periods(job, program.stage, program.step_starts)
        return None if span is None else replace(span, reach=reach(program.stream.nodes, span))

    # a folded run's files (its representatives'), each opened: indexed by the worker that wrote it
    write_job(job, placement, folder / job.name, ranks, progress, on_program=None if periods is None else periods_of,
              answers=periods, workers=workers, index_files=ranks == placement.representatives)
    if periods is not None:
        spans.write_text(json.dumps({rank: None if span is None else [span.first, span.end, span.nodes, span.reach]
                                     for rank, span in periods.items()}))
    stamp.write_text(digest)
    return paths, False


def write_job(job: JobSpec, placement: Placement, prefix: Path, ranks: list[int] | None = None,
              progress: GenerationProgress | None = None, compress: bool = False,
              on_program: Callable[[int, RankProgram], Any] | None = None, answers: dict[int, Any] | None = None,
              workers: int = 1, index_files: bool = False) -> list[Path]:
    """Write PREFIX.<rank>.et for `ranks` (default every rank; gzipped with `compress`; in up to
    `workers` processes: rank_writer.py), removing rank files of an earlier, larger job under the
    same prefix; `progress(ranks written, ranks)` after each; `on_program(rank, program)`'s
    answers go in `answers`; with `index_files`, each worker indexes the files it wrote for the
    run that opens them (feeder/written.py)."""
    ranks = list(range(placement.world)) if ranks is None else ranks
    meta = metadata({"generator": GENERATOR, "model": job.shape.name or "inline", "gpus": placement.world,
                     "device": "none: compute nodes are timed from num_ops and shapes"})
    with RankFiles(prefix, len(ranks), "job.cluster.gpus") as staged:
        task = RankFilesTask(job, placement, meta, {rank: staged.path(rank) for rank in ranks}, compress, on_program,
                             index_files)
        written.forget_all()   # an earlier job's indexes never opened
        said, found = write_ranks(task, ranks, workers, progress)
        if answers is not None:
            answers.update(said)
        paths = staged.commit()
    for rank, path in zip(ranks, paths):
        if rank in found:
            written.remember(path, found[rank])
    return paths


def is_job(data: Mapping[str, Any]) -> bool:
    return isinstance(data, Mapping) and "job" in data


def job_config(data: Mapping[str, Any], host: PluginHost, base_dir: Path, source: str,
               out_dir: str | Path | None = None, progress: GenerationProgress | None = None,
               workers: int = 1) -> RunConfig:
    """Validate a job manifest, generate its traces (`progress(ranks written, ranks)`; in up to
    `workers` processes), and return the run's configuration."""
    unknown = sorted(set(data) - {"job", "cluster", "workload", "output", *LAYER_DEFAULTS})
    if unknown:
        raise ManifestError([(f"{source}: {unknown[0]}", "unknown section of a job manifest (known: job, "
                              f"cluster, workload, output, {', '.join(LAYER_DEFAULTS)})")])
    missing = [layer for layer in ("compute", "system") if not isinstance(data.get(layer), Mapping)]
    if missing:
        raise ManifestError([(f"{source}: {layer}", f"required: a job names its {layer} layer (`plugin:`; "
                              "chakra-sim plugins lists them; see docs/training.md)") for layer in missing])
    job = expand_job(data, base_dir, source, out_dir, progress, _time_fold_refusal(data, host), workers)
    try:
        _cluster_defaults(job, host)
        config = build_config(job.manifest, host, base_dir, source, traces=job.traces)
    except BaseException:
        if job.lock is not None:   # refused after the traces were written: the folder stays usable
            job.lock.release()
        raise
    config.spec.folding = job.folding
    config.spec.time_folding = job.time_folding
    config.spec.unfolded_traces = job.unfolded_traces
    config.spec.time_fold_note = job.time_fold_note
    config.spec.step_parts = True
    config.spec.training = job.info
    config.spec.manifest["job"] = job.info.job.model_dump(mode="json")
    config.output_lock = job.lock
    config.traces_written = None if job.reused else job.trace_prefix.parent
    config.spec.warnings.extend(w for w in job.info.job.warnings() if w not in config.spec.warnings)
    if job.reused:
        config.notes.append(f"reusing the job's traces in {job.trace_prefix.parent} "
                            f"(generated for this job by chakra-sim {__version__}; a changed job or "
                            "generator regenerates them)")
    return config


def _time_fold_refusal(data: Mapping[str, Any], host: PluginHost) -> str:
    """Why the layers the manifest names cannot fold in time, as far as their classes say ("" when
    they may: an instance may still refuse, and the engine then simulates the whole step's
    traces, written then)."""
    chosen = []
    for layer in LAYER_DEFAULTS:
        section = data.get(layer)
        plugin = section.get("plugin") if isinstance(section, Mapping) else None
        if isinstance(plugin, str):
            try:
                chosen.append((layer, plugin, host.get(layer, plugin).cls.time_fold_safe))
            except PluginError:
                return "a layer's plugin is not installed"      # reported when the layers are built
    return unsafe_layers(chosen)


def _cluster_defaults(job: JobRun, host: PluginHost) -> None:
    """Layers that need a hardware profile, or take GPUs per node, get the cluster's unless they
    say; a memory layer timing activation offload gets host memory where its config takes it."""
    defaults = {"profile": job.info.profile_name, "gpus-per-node": job.info.gpus_per_node}
    for layer in LAYER_DEFAULTS:
        section = job.manifest.get(layer)
        plugin = section.get("plugin") if isinstance(section, Mapping) else None
        if not isinstance(section, Mapping) or not isinstance(plugin, str):
            continue
        try:
            config_cls = host.get(layer, plugin).cls.Config
        except PluginError:
            continue   # an unknown plugin: build_config reports it, listing the installed ones
        filled = with_cluster_defaults(config_cls, section, defaults)
        if layer == "memory" and job.memory_defaults:
            filled = with_cluster_defaults(config_cls, filled, job.memory_defaults, any_key=True)
        job.manifest[layer] = filled


def with_cluster_defaults(config_cls: Any, section: Mapping[str, Any], defaults: Mapping[str, Any],
                          any_key: bool = False) -> JsonObject:
    """A layer's section with the cluster's `defaults` (profile, gpus-per-node) where its config
    takes them and the section does not say (under the key's alias or its field name): a required
    profile, the GPUs per node anywhere; with `any_key`, every key the config takes."""
    fields = config_cls.model_fields
    keys = {field.alias or name for name, field in fields.items()
            if any_key or field.is_required() or (field.alias or name) == "gpus-per-node"}
    said = {*section, *(field.alias for name, field in fields.items() if name in section and field.alias)}
    return {**{k: v for k, v in defaults.items() if k in keys and k not in said}, **section}
