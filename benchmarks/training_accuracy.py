"""Predicted vs published training steps: regenerates docs/training-accuracy.md and the error bands
a job's results carry (chakra_core/jobs/presets/accuracy-runs.json).

    python benchmarks/training_accuracy.py                   # every verified run, all mechanisms on
    python benchmarks/training_accuracy.py --ablation        # also each mechanism off, for the ablation table
                                                             # (on the smallest run of each source and
                                                             # precision; --ablation-all: on every run)
    python benchmarks/training_accuracy.py --only sc21       # runs whose id contains "sc21" (printed; the document only with --doc)
    python benchmarks/training_accuracy.py --workers 2       # runs in parallel processes
    python benchmarks/training_accuracy.py --fold-check 64   # also run fold: off up to 64 GPUs and compare

Each run is described as its source describes it (model preset, GPUs, batch sizes, TP/PP/VP/CP,
precision) plus the settings its `settings` list gives in benchmarks/data/training-runs.yaml
(each with why: the source's launcher or config, or the default taken where it is silent).
Predictions are spec-only: the hardware profiles' public constants, nothing fitted to these step
times. Error = |predicted / measured - 1|; geomean error = exp(mean |ln(predicted / measured)|) - 1;
mean signed error = exp(mean ln(predicted / measured)) - 1. Results are cached per run, variant,
the simulator's data files and the run's profile chain (--cache), so a re-render after an
interrupted or partial run reuses them; a cached result holds while every simulator module its
process had imported is unchanged, so a change to a module no run imports (the planner, the CLI)
keeps the cache, as does a change to another GPU's profile.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import re
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chakra_core import run as runner  # noqa: E402
from chakra_core._atomic import atomic_write_text  # noqa: E402
from chakra_core.hardware.profiles import load_profile  # noqa: E402
from chakra_core.jobs.bands import RUNS_FILE, band_of, PublishedRun  # noqa: E402
from chakra_core.jobs.flops import model_flops  # noqa: E402
from chakra_core.jobs.fp8 import QUANTIZED  # noqa: E402
from chakra_core.jobs.spec import Effects, JobSpec  # noqa: E402

from chakra_sim_compute_achievable.effects import AchievableEffects  # noqa: E402

from _kernel_split import moe_split  # noqa: E402

RUNS = ROOT / "benchmarks" / "data" / "training-runs.yaml"
DOC = ROOT / "docs" / "training-accuracy.md"
CACHE = ROOT / "benchmarks" / ".cache" / "training-accuracy"
PROFILES = {"h100-sxm": "h100-hgx-ndr400", "a100-sxm-80gb": "a100-hgx-hdr200", "b200": "b200-hgx-ndr400",
            "gb200": "gb200-nvl72-ndr400", "gb300": "gb300-nvl72-xdr800"}
"""DGX H100 (8 x ConnectX-7 NDR 400), Selene's DGX A100 (8 x HDR 200 for compute traffic), DGX B200
(8 x ConnectX-7 400G), DGX GB200 / GB300 NVL72 racks (ConnectX-7 400G / ConnectX-8 800G per GPU)."""

MECHANISMS = [(f"compute.{name}", field.description or name) for name, field in AchievableEffects.model_fields.items()]
MECHANISMS += [(f"job.{name}", field.description or name) for name, field in Effects.model_fields.items()]
"""Every mechanism's switch: `compute.effects.<name>` or `job.effects.<name>`."""


def job_of(run: dict[str, Any]) -> dict[str, Any]:
    parallel: dict[str, Any] = {"tp": run["tp"], "pp": run["pp"], "cp": run["cp"] or 1}
    if run.get("vp"):
        parallel["vp"] = run["vp"]
    if (run.get("ep") or 1) > 1:
        parallel["ep"] = run["ep"]
    training: dict[str, Any] = {"seq": run["seq"], "global_batch": run["gbs"], "micro_batch": run["mbs"] or 1,
                                "precision": run["precision"]}
    cluster: dict[str, Any] = {"gpus": run["gpus"], "profile": PROFILES[run["gpu"]]}
    for setting in run.get("settings", []):
        parallel.update(setting.get("parallel", {}))
        training.update(setting.get("training", {}))
        cluster.update(setting.get("cluster", {}))
        cluster["profile"] = setting.get("profile", cluster["profile"])
    if training["precision"] != "fp8":
        training.pop("fp8_recipe", None)
    return {"name": "step", "model": run["model"], "parallel": parallel, "training": training, "cluster": cluster}


FOLD_OFF = "workload.fold_off"
"""The variant simulated unfolded (--fold-check): its results must equal the folded run's."""


def manifest_of(job: dict[str, Any], out: Path, off: str | None) -> dict[str, Any]:
    compute: dict[str, Any] = {"plugin": "achievable"}
    job = json.loads(json.dumps(job))
    # activation offload's copies are memory nodes: host memory per GPU at the profile's host link
    memory = {"memory": {"plugin": "hbm", "track_tensors": False}} if job["training"].get("cpu_offloading_num_layers") else {}
    if off == FOLD_OFF:
        return {"job": job, "workload": {"fold": "off"}, "output": {"dir": str(out)}, "compute": compute,
                "system": {"plugin": "nccl"}, **memory}
    if off is not None:
        layer, name = off.split(".")
        if layer == "compute":
            compute["effects"] = {name: False}
        else:
            job["effects"] = {name: False}
    return {"job": job, "output": {"dir": str(out)}, "compute": compute, "system": {"plugin": "nccl"}, **memory}


PROFILE_DIR = ROOT / "chakra_core" / "hardware" / "profiles"
BANDS_FILE = RUNS_FILE.relative_to(ROOT)
"""The error bands this script writes, relative to the tree (not keyed: _shared_data_digest)."""


@lru_cache(maxsize=1)
def _shared_data_digest() -> str:
    """The simulator's data files any run may read (presets, tables: every file under chakra_core
    and the plugins but Python sources, bytecode, tests and the hardware profiles, which a run reads
    only along its own profile's `extends` chain: _profile_digest), less the error bands this
    script writes, which label a run's results without changing its step (_results_digest)."""
    digest = hashlib.sha256()
    for folder in (ROOT / "chakra_core", ROOT / "plugins"):
        for path in sorted(folder.rglob("*")):
            relative = path.relative_to(ROOT)
            parts = set(relative.parts)
            if path.is_file() and path.suffix not in (".py", ".pyc") and path.parent != PROFILE_DIR \
                    and relative != BANDS_FILE \
                    and not parts & {"tests", "__pycache__"} and not any(part.endswith(".egg-info") for part in parts):
                digest.update(str(relative).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


@lru_cache(maxsize=None)
def _profile_digest(name: str) -> str:
    """A shipped profile's file and those of its `extends` chain: editing or adding another profile
    keeps this run's cached result."""
    digest, seen = hashlib.sha256(), set()
    while name and name not in seen:
        seen.add(name)
        path = PROFILE_DIR / f"{name}.yaml"
        text = path.read_bytes()
        digest.update(name.encode() + b"\0" + text)
        parent = (yaml.safe_load(text) or {}).get("extends")
        name = parent if isinstance(parent, str) else ""
    return digest.hexdigest()[:16]


def _cache_key(run_id: str, job: dict[str, Any], off: str | None) -> str:
    data = [_shared_data_digest(), _profile_digest(job["cluster"]["profile"])]
    return hashlib.sha256(json.dumps([run_id, job, off, data], sort_keys=True).encode()).hexdigest()[:20]


@lru_cache(maxsize=None)
def _file_hash(path: str) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
    except OSError:
        return None


def _imported_sources() -> dict[str, str | None]:
    """The simulator's modules (chakra_core, the chakra_sim_* plugins) this process has imported,
    by name, with their source's hash: what the runs it simulated depended on."""
    found: dict[str, str | None] = {}
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if file and (name.split(".")[0] == "chakra_core" or name.startswith("chakra_sim_")):
            found[name] = _file_hash(file)
    return found


def _still_holds(record: dict[str, Any]) -> bool:
    """Whether every module the cached run's process had imported is as it was."""
    sources = record.get("sources")
    if not isinstance(sources, dict):
        return False
    for name, digest in sources.items():
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            return False
        if spec is None or not spec.origin or _file_hash(spec.origin) != digest:
            return False
    return True


def _results_digest(ranks: Any, training: dict[str, Any]) -> str:
    """What a run computed (every rank's row, the step and its split), for the folded and unfolded
    runs' comparison; not the error band the results carry, which this script's last run wrote."""
    computed = {key: value for key, value in training.items() if key != "error_band"}
    return hashlib.sha256(json.dumps([ranks, computed], sort_keys=True).encode()).hexdigest()


def simulate_one(task: tuple[dict[str, Any], str | None, str]) -> dict[str, Any]:
    """One run (one variant) in this process; its step, split and wall time."""
    run, off, cache = task
    job = job_of(run)
    path = Path(cache) / f"{run['id']}--{off or 'model'}--{_cache_key(run['id'], job, off)}.json"
    if path.exists():
        cached = json.loads(path.read_text())
        if _still_holds(cached):
            return {key: value for key, value in cached.items() if key != "sources"}
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        prepared = runner.prepare(runner.load(manifest_of(job, Path(tmp), off), base_dir=Path(tmp), name=job["name"]))
        result = prepared.simulate()
        wall = time.perf_counter() - started
        training = result.document["training"]
        spec = JobSpec.model_validate(job)
        split = moe_split(Path(tmp) / "traces", job["name"], spec.parallel.pp, spec.cluster.gpus,
                          prepared.simulation.layers["compute"], training["breakdown_by_stage_s"],
                          prepared.simulation.spec.time_folding) if spec.shape.moe and off is None else None
    same = _results_digest(result.document["ranks"], training)
    record = {"id": run["id"], "off": off, "step": training["step_time_s"], "breakdown": training["breakdown_s"],
              "wall": wall, "results_digest": same, "moe_split": split}
    cached_record = {**record, "sources": _imported_sources()}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(cached_record))
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="only runs whose id contains this")
    parser.add_argument("--ablation", action="store_true",
                        help="also simulate with each mechanism off the smallest run of each source and precision")
    parser.add_argument("--ablation-all", action="store_true", help="the ablation on every run")
    parser.add_argument("--workers", type=int, default=1, help="runs simulated in parallel processes")
    parser.add_argument("--fold-check", type=int, default=0, metavar="GPUS",
                        help="also simulate runs of up to GPUS unfolded (workload.fold: off) and compare")
    parser.add_argument("--cache", type=Path, default=CACHE, help="folder of cached results")
    parser.add_argument("--doc", type=Path, help=f"the document to write (default: {DOC.relative_to(ROOT)}; with "
                                                 "--only, none: a part of the table must not replace the whole)")
    args = parser.parse_args()
    data = yaml.safe_load(RUNS.read_text())
    runs = [r for r in data["runs"] if args.only in r["id"] and r.get("verified", True)]
    variants: list[str | None] = [None] + ([name for name, _ in MECHANISMS] if args.ablation or args.ablation_all else [])
    ablated = runs if args.ablation_all else ablation_set(runs)
    tasks = [(run, None, str(args.cache)) for run in runs]
    tasks += [(run, off, str(args.cache)) for off in variants[1:] for run in ablated]
    tasks += [(run, FOLD_OFF, str(args.cache)) for run in runs if run["gpus"] <= args.fold_check]
    results: dict[tuple[str, str | None], dict[str, Any]] = {}
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        for record in pool.map(simulate_one, tasks):
            results[(record["id"], record["off"])] = record
            if record["off"] == FOLD_OFF:
                same = record["results_digest"] == results[(record["id"], None)]["results_digest"]
                print(f"{record['id']} [fold off]: {'identical results' if same else 'DIFFERENT results'}", flush=True)
                continue
            measured = next(r for r in runs if r["id"] == record["id"])["measured"]["step_time_s"]
            print(f"{record['id']} [{record['off'] or 'model'}]: measured {measured:.3f} s, predicted "
                  f"{record['step']:.3f} s ({record['step'] / measured - 1:+.1%}), {record['wall']:.1f} s", flush=True)
    excluded = [r for r in data["runs"] if args.only in r["id"] and not r.get("verified", True)]
    folds = [(run["id"], results[(run["id"], FOLD_OFF)]["results_digest"] == results[(run["id"], None)]["results_digest"])
             for run in runs if (run["id"], FOLD_OFF) in results]
    command = " ".join(arg for arg in sys.argv[1:] if not arg.startswith("--cache") and "/" not in arg) \
        or "(no options)"   # how this document was made (a cache folder is not part of it)
    doc = args.doc or (None if args.only else DOC)
    if doc is not None:
        atomic_write_text(doc, render(runs, results, variants, excluded, folds, command))
        print(f"wrote {doc}")
    if not args.only and doc == DOC:   # the error bands come from the whole table only
        write_bands(runs, results)


def ablation_set(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs the ablation simulates again: of each source and precision the one on the
    fewest GPUs (a rule that does not look at the errors; every source and precision appears)."""
    chosen: dict[tuple[str, str, str], dict[str, Any]] = {}
    for run in runs:
        key = (_source(run), run["precision"])
        if key not in chosen or run["gpus"] < chosen[key]["gpus"]:
            chosen[key] = run
    return [run for run in runs if any(run is c for c in chosen.values())]


def write_bands(runs: list[dict[str, Any]], results: dict[tuple[str, str | None], dict[str, Any]]) -> None:
    """Every run's predicted / measured step, for the error band of a job's results (chakra_core.jobs.bands)."""
    out = []
    for run in runs:
        gpu = load_profile(job_of(run)["cluster"]["profile"]).gpu
        out.append({"id": run["id"], "gpu_model": gpu.model, "architecture": gpu.architecture,
                    "precision": run["precision"], "gpus": run["gpus"],
                    "ratio": round(results[(run["id"], None)]["step"] / run["measured"]["step_time_s"], 6),
                    "moe": is_moe(run)})
    atomic_write_text(RUNS_FILE, json.dumps({"generator": "benchmarks/training_accuracy.py", "runs": out}, indent=1) + "\n")
    print(f"wrote {RUNS_FILE}")


def is_moe(run: dict[str, Any]) -> bool:
    """Whether the run's model is a mixture of experts."""
    return JobSpec.model_validate(job_of(run)).shape.moe


def _stats(ratios: list[float]) -> tuple[float, float, float]:
    return band_of([PublishedRun("", "", "", "", 1, r) for r in ratios]) if ratios else (math.nan,) * 3


PUBLICATIONS = {"nemo-24.07": "NVIDIA NeMo performance summary (24.07)", "nemo-24.03": "NVIDIA NeMo performance summary (24.03, long sequences)",
                "mbridge": "NVIDIA Megatron-Bridge performance summary", "sc21": "Narayanan et al., SC'21",
                "korthikanti22": "Korthikanti et al. 2022", "mcore080": "Megatron-LM README (Megatron-Core 0.8)",
                "dgxc": "NVIDIA dgxc-benchmarking", "nemotron4": "Nemotron-4 15B report", "bloom": "BigScience BLOOM",
                "llama3": "Meta, The Llama 3 Herd of Models"}
"""Each run's publication (by its id's prefix): the unit the headline counts sources in."""


def publication(run: dict[str, Any]) -> str:
    return next(name for prefix, name in PUBLICATIONS.items() if run["id"].startswith(prefix))


def _source(run: dict[str, Any]) -> str:
    release = run["source"].get("release") or run["source"]["title"]
    return release


def render(runs: list[dict[str, Any]], results: dict[tuple[str, str | None], dict[str, Any]],
           variants: list[str | None], excluded: list[dict[str, Any]], folds: list[tuple[str, bool]],
           command: str = "--ablation --workers 2 --fold-check 64") -> str:
    ratio = {run["id"]: results[(run["id"], None)]["step"] / run["measured"]["step_time_s"] for run in runs}
    geo, signed, worst = _stats(list(ratio.values()))
    sources: dict[str, list[float]] = {}
    for run in runs:
        sources.setdefault(_source(run), []).append(ratio[run["id"]])
    by_pub: dict[str, list[float]] = {}
    for run in runs:
        by_pub.setdefault(publication(run), []).append(ratio[run["id"]])
    pubs = {name: len(group) for name, group in by_pub.items()}
    pub_geo = math.exp(sum(math.log(1 + _stats(g)[0]) for g in by_pub.values()) / len(by_pub)) - 1
    classes: dict[str, list[float]] = {}
    for run in runs:
        gpu = run["gpu"].split("-")[0].upper()
        kind = ", mixtures of experts" if is_moe(run) else ""
        bits = run["precision"] if run["precision"] in QUANTIZED else "16-bit"
        classes.setdefault(f"{gpu}, {bits}{kind}", []).append(ratio[run["id"]])
    out = ["# Training steps: predicted vs published", "",
           f"Generated by `python benchmarks/training_accuracy.py {command}` from "
           "`benchmarks/data/training-runs.yaml` (each run's source, table, the settings taken from its launcher "
           "or config and why, and configuration notes are there). Spec-only: the jobs are described as the "
           "sources describe them, timed by the `achievable` compute layer and the `nccl` system layer with the "
           "shipped hardware profiles; nothing is fitted to these step times. TFLOP/s per GPU use the formula "
           "each source uses (chakra_core/jobs/flops.py), so their error equals the step time's.", "",
           f"**{len(runs)} runs from {len({publication(r) for r in runs})} publications: geomean error {geo:.1%}, mean signed error "
           f"{signed:+.1%}, worst {worst:.1%}** (geomean error = exp(mean |ln(predicted/measured)|) - 1; mean signed "
           "error = exp(mean ln(predicted/measured)) - 1, negative when too fast; worst = exp(max |ln(predicted/measured)|) - 1, "
           "the farthest run counted as the geomean counts it, so a run 20% too fast counts 25%). A job's results carry the error of the closest class of these runs "
           f"(chakra_core/jobs/bands.py). One publication holds {max(pubs.values())} of the runs; weighting every "
           f"publication alike (the geomean of their geomean errors): {pub_geo:.1%}.", "",
           "| class | runs | geomean error | mean signed error | worst |", "|---|---:|---:|---:|---:|"]
    for name, group in sorted(classes.items()):
        g, s, w = _stats(group)
        out.append(f"| {name} | {len(group)} | {g:.1%} | {s:+.1%} | {w:.1%} |")
    out += ["", "By source:", "", "| source | runs | geomean error | mean signed error | worst |", "|---|---:|---:|---:|---:|"]
    for name, group in sources.items():
        g, s, w = _stats(group)
        out.append(f"| {name} | {len(group)} | {g:.1%} | {s:+.1%} | {w:.1%} |")
    out += _ablation(runs, results, variants, geo, signed)
    out += ["", "## Runs", "",
            "| run | GPUs | layout (TP/PP/VP/CP/DP, MBS, GBS) | precision | measured step s | predicted step s "
            "| error | measured TFLOP/s/GPU | predicted TFLOP/s/GPU | simulated in s |",
            "|---|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    for run in runs:
        job = job_of(run)
        spec = JobSpec.model_validate(job)
        p, step = spec.parallel, results[(run["id"], None)]["step"]
        layout = f"{p.tp}/{p.pp}/{p.vp or 1}/{p.cp}/{spec.dp}, {spec.training.micro_batch}, {spec.training.global_batch}"
        if p.ep > 1:
            layout += f"; EP {p.ep}, ETP {p.expert_tp}"
        measured = run["measured"]["step_time_s"]
        tflops = model_flops(spec, run["flops_formula"]) / step / run["gpus"] / 1e12
        published = run["measured"].get("tflops_per_gpu")
        shown = f"{published:g}" if published is not None else "-"
        precision = run["precision"] + (f" ({spec.training.fp8_recipe})" if run["precision"] == "fp8" else "")
        out.append(f"| [{run['id']}]({run['source']['url']}) | {run['gpus']:,} | {layout} | {precision} | "
                   f"{measured:.3f} | {step:.3f} | {step / measured - 1:+.1%} | {shown} | {tflops:.0f} | "
                   f"{results[(run['id'], None)]['wall']:.1f} |")
    out += ["", "## Where the time goes", "",
            "The slowest rank's step, split exclusively (sums to the step): compute by part, communication "
            "exposed (nothing computing) by communicator, and the pipeline bubble (waiting for a pipeline "
            "neighbour, or nothing in flight). Seconds.", "",
            "| run | forward | backward | recompute | optimizer | other compute | TP | CP | DP | PP | bubble | step |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for run in runs:
        record = results[(run["id"], None)]
        b = record["breakdown"]
        cells = [b["compute_forward"], b["compute_backward"], b["compute_recompute"], b["compute_optimizer"],
                 b["compute_other"], b["exposed_tp"], b["exposed_cp"], b["exposed_dp"], b["exposed_pp"] + b["exposed_other"],
                 b["bubble"], record["step"]]
        out.append(f"| {run['id']} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
    out += _moe_table(runs, results)
    out += _gpu_ratios(runs, results)
    if folds:
        out += ["", "## Folding", "", "`workload.fold: auto` (one rank per pipeline stage, and per class of CP ranks "
                "whose rings cross between nodes alike) against `off` (every rank):", ""]
        out += [f"- {run_id}: {'identical results' if same else 'DIFFERENT results'}" for run_id, same in folds]
    if excluded:
        out += ["", "## Published runs not compared", ""]
        out += [f"- {run['id']}: {run.get('excluded') or 'not verified against its primary source'}" for run in excluded]
    out += ["", "## Settings taken where the sources are silent", "",
            "Every run's settings and why are in `benchmarks/data/training-runs.yaml`; the defaults taken where a "
            "source says nothing:", ""]
    whys: dict[str, list[str]] = {}
    for run in runs:
        for setting in run.get("settings", []):
            whys.setdefault(setting["why"], []).append(run["id"])
    for why, ids in whys.items():
        if any(word in why for word in ("not stated", "taken", "assumed", "silent", "defaults")):
            out.append(f"- {why} ({len(ids)} run{'s' if len(ids) > 1 else ''}: {ids[0]}{', ...' if len(ids) > 1 else ''})")
    out.append("")
    return "\n".join(out)


def _moe_table(runs: list[dict[str, Any]], results: dict[tuple[str, str | None], dict[str, Any]]) -> list[str]:
    moe = [run for run in runs if results[(run["id"], None)].get("moe_split")]
    if not moe:
        return []
    out = ["", "## Mixtures of experts: where the time goes", "",
           "The slowest pipeline stage's step by kind of work (benchmarks/_kernel_split.py): attention and the MoE "
           "block's compute (router, permutes, grouped expert GEMMs, shared experts) as their kernels' own times "
           "under the compute model, the dispatcher's all-to-alls and expert-TP collectives where nothing computes "
           "(simulated `exposed_ep`), and the rest (dense layers' MLPs, norms, embedding and output layer, "
           "optimizer, other exposed communication, the bubble, and kernels slowed beside communication). Seconds, "
           "with shares of the step.", "",
           "| run | attention | MoE compute | dispatch/combine exposed | rest | step |", "|---|---:|---:|---:|---:|---:|"]
    for run in moe:
        split = results[(run["id"], None)]["moe_split"]
        cells = [f"{split[k]:.3f} ({split[k] / split['step']:.0%})" for k in ("attention", "moe", "exposed_ep", "rest")]
        out.append(f"| {run['id']} | " + " | ".join(cells) + f" | {split['step']:.3f} |")
    return out


def _gpu_ratios(runs: list[dict[str, Any]], results: dict[tuple[str, str | None], dict[str, Any]]) -> list[str]:
    """Runs of one model, container release and precision on different GPUs: the published speed-up
    per GPU against the predicted one (what a buyer comparing parts asks), each GPU in the layout
    and recipe its own run published."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault((run["model"], _container(run), run["precision"]), []).append(run)
    rows, ratios = [], []
    for (model, release, precision), group in groups.items():
        base = next((r for r in group if r["gpu"].startswith("h100")), None)
        if base is None:
            continue
        for other in group:
            if other["gpu"] == base["gpu"]:
                continue
            published = other["measured"]["tokens_per_s_per_gpu"] / base["measured"]["tokens_per_s_per_gpu"]
            tokens = {r["id"]: r["gbs"] * r["seq"] / results[(r["id"], None)]["step"] / r["gpus"] for r in (base, other)}
            predicted = tokens[other["id"]] / tokens[base["id"]]
            ratios.append(predicted / published)
            gpus = f"{other['gpu'].upper()} x {other['gpus']:,} / {base['gpu'].upper()} x {base['gpus']:,}"
            recipes = f"{_recipe(other)} / {_recipe(base)}"
            rows.append(f"| {model}, {release} | {gpus} | {recipes} | {published:.3f} | {predicted:.3f} | "
                        f"{predicted / published - 1:+.1%} |")
    if not rows:
        return []
    geo, signed, _ = _stats(ratios)
    return ["", "## The same model on different GPUs", "",
            "Tokens per second per GPU of one model and container release on another GPU over H100's, published and "
            "predicted (each run in its own published layout and precision recipe): geomean error "
            f"{geo:.1%} over {len(ratios)} pairs, mean signed {signed:+.1%} (positive: the "
            "other GPU predicted the faster against H100 than published).", "",
            "| model, release | GPUs | recipes | published ratio | predicted ratio | error |",
            "|---|---|---|---:|---:|---:|", *rows]


def _container(run: dict[str, Any]) -> str:
    """The container release a run was measured with ("NeMo 26.06 container"), whichever way its
    source writes the Megatron Bridge version beside it."""
    found = re.match(r"NeMo [\d.]+ container", _source(run))
    return found.group(0) if found else _source(run)


def _recipe(run: dict[str, Any]) -> str:
    training = job_of(run).get("training") or {}
    precision = training.get("precision", run["precision"])
    recipe = f"{precision} ({training.get('fp8_recipe', 'delayed')})" if precision == "fp8" else str(precision)
    return recipe + (", Megatron-FSDP" if training.get("use_megatron_fsdp") else "")


def _ablation(runs: list[dict[str, Any]], results: dict[tuple[str, str | None], dict[str, Any]],
              variants: list[str | None], geo: float, signed: float) -> list[str]:
    if len(variants) < 2:
        return []
    ablated = [run for run in runs if all((run["id"], off) in results for off in variants[1:])]
    base = [results[(run["id"], None)]["step"] / run["measured"]["step_time_s"] for run in ablated]
    geo, signed, _ = _stats(base)
    subset = "every run" if len(ablated) == len(runs) else (
        f"the {len(ablated)} runs that are the smallest of their source and precision")
    out = ["", "## What each mechanism moves", "",
           f"Each mechanism switched off alone (`compute.effects.<name>: false` or `job.effects.<name>: false`) on "
           f"{subset}: the geomean and mean signed errors of those runs without it, and how far it moves the "
           "step on average (the ratio of the mean signed errors).", "",
           "| mechanism | what it models | geomean error without it | mean signed error without it | what it adds "
           "to the step |", "|---|---|---:|---:|---:|",
           f"| (all on) | | {geo:.1%} | {signed:+.1%} | |"]
    for off in variants[1:]:
        ratios = [results[(run["id"], off)]["step"] / run["measured"]["step_time_s"] for run in ablated]
        g, s, _ = _stats(ratios)
        what = dict(MECHANISMS)[off or ""]
        out.append(f"| `{off}` | {what} | {g:.1%} | {s:+.1%} | {(1 + signed) / (1 + s) - 1:+.1%} |")
    return out


if __name__ == "__main__":
    main()
