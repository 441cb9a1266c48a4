#!/usr/bin/env python3
"""Predicted peak memory per GPU (chakra_core.plan.memory) against published figures.

    python benchmarks/plan_memory.py

Prints a Markdown table: per published figure its source, the configuration, the figure, the
prediction and the error, then the sources. Every figure is copied from the source named; nothing
is fitted. The sources:

- Megatron-LM's CI records, for two GPT jobs of Llama-3-8B's attention shape on 8 GPUs, the peak
  of PyTorch's allocator (`mem-max-allocated-bytes`, torch.cuda.memory_stats()
  "allocated_bytes.all.peak") and what stays allocated after a step (`mem-allocated-bytes`), as
  golden values (tests/functional_tests/test_cases/gpt/gpt3_7b_{tp1_pp4,tp4_pp1}_memory_speed).
  The job is each test's model_config.yaml with Megatron-LM's defaults for what it leaves out
  (megatron/training/arguments.py: ffn_hidden_size 4 x hidden, hidden and attention dropout 0.1,
  LayerNorm, learned absolute positions, linear biases; no --sequence-parallel; bf16 gradients
  reduced in fp32); vocabulary 131072 + 1 (NullTokenizer adds the end-of-document token,
  megatron/training/tokenizer/tokenizer.py); 8 GPUs (recipes h100/gpt.yaml: 1 node x 8,
  gb200/gpt.yaml: 2 nodes x 4). The figures are the last rank's (megatron/training/global_vars.py
  creates the tensorboard writer on rank world_size - 1): the last pipeline stage.
- ZeRO (Rajbhandari et al. 2020), Figure 1: model states of a 7.5B-parameter model with mixed
  precision Adam (K = 12) on 64 data-parallel GPUs: 120 GB replicated, 31.4 GB with the optimizer
  states partitioned (P_os, what Megatron's distributed optimizer does). ZeRO counts fp16
  gradients: compared with grad_reduce_dtype bf16.
- Megatron-LM's docs/source/api-guide/dist_optimizer.md: bytes per parameter, d = 8.
- Korthikanti et al. 2022, Table 2: activations per layer, as formulas, at GPT-3 175B's shape.

A second table sets each prediction against the `hbm` memory layer's simulated peak for the same
job (two mixtures of experts among them): its traces generated with `tensors: true` (chakra_core.jobs.tensors), simulated folded with
the achievable compute model and the nccl system layer; the peak is the largest of any rank, as
the prediction is the largest of any stage.

Not used: Korthikanti et al.'s per-GPU memory of the 22B-1T models (a bar chart; no numbers
readable in the text found); the Llama 3 paper (no per-GPU memory figure found); NeMo and
Megatron-Bridge performance tables (throughput only); the table of Megatron-LM PR #482 (Llama 2 7B
on H800, peaks 28.8-69.1 GB) does not give the sequence length, so its jobs cannot be rebuilt.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chakra_core.jobs.spec import JobSpec  # noqa: E402
from chakra_core.plan.memory import GIB, layer_activations, memory_by_stage  # noqa: E402

MEGATRON = "https://github.com/NVIDIA/Megatron-LM/blob"
CASES = f"{MEGATRON}/{{commit}}/tests/functional_tests/test_cases/gpt/{{case}}/{{file}}"
SOURCES = {
    "[1]": "Megatron-LM CI golden values: "
           + CASES.format(commit="070712a0bf439eb310ca4f2c16d9446f1ddc5b8f", case="gpt3_7b_tp1_pp4_memory_speed",
                          file="golden_values_dev_dgx_h100.json") + ", "
           + CASES.format(commit="14d1ab6cdf34a3abdbd9c87571b8ba514832904f", case="gpt3_7b_tp1_pp4_memory_speed",
                          file="golden_values_dev_dgx_gb200.json") + ", "
           + CASES.format(commit="09eb91e5752df401e05645fea9c2721d8e765971", case="gpt3_7b_tp4_pp1_memory_speed",
                          file="golden_values_dev_dgx_h100.json") + ", "
           + CASES.format(commit="089dacacfaae78a09403e2f05d81432b0d357bbe", case="gpt3_7b_tp4_pp1_memory_speed",
                          file="golden_values_dev_dgx_gb200.json") + "; jobs: "
           + CASES.format(commit="01b9cb2335333fbcf86470211c6b955fa6f0665d", case="gpt3_7b_tp1_pp4_memory_speed",
                          file="model_config.yaml") + ", "
           + CASES.format(commit="2efc870f72b4ade6f15270afae443ea110e62f67", case="gpt3_7b_tp4_pp1_memory_speed",
                          file="model_config.yaml") + "; GPUs: "
           + f"{MEGATRON}/05daf93fd919f9c16f6d22b7028b515c0b3474b8/tests/test_utils/recipes/h100/gpt.yaml, "
           + f"{MEGATRON}/00611e6eeb0b09b5ee074750956855215ddbd67f/tests/test_utils/recipes/gb200/gpt.yaml",
    "[2]": "Rajbhandari et al., ZeRO: Memory Optimizations Toward Training Trillion Parameter Models, SC'20, "
           "Figure 1: https://arxiv.org/abs/1910.02054",
    "[3]": "Megatron-LM distributed optimizer: "
           f"{MEGATRON}/main/docs/source/api-guide/dist_optimizer.md "
           "(https://docs.nvidia.com/megatron-core/developer-guide/latest/distrib_optimizer.html)",
    "[4]": "Korthikanti et al., Reducing Activation Recomputation in Large Transformer Models, Table 2: "
           "https://arxiv.org/abs/2205.05198",
}

NOTES = [
    "[1] the peaks depend on the schedule following current mcore (the walk and the generated traces): "
    "warm-up of 2 (pp - stage - 1) + (vp - 1) pp chunk forwards even when micro-batches == pp. Running every "
    "forward first (older Megatron-LM) would put 4 micro-batches of fp32 logits on the last stage, 15.3 GiB "
    "more (a prediction of 71.3 GiB against the 56.4 measured).",
    "[1] after step, TP 1 PP 4: the last rank keeps about 1.1 GB more after the step than its weights, "
    "gradients and optimizer state (TP 4 PP 1: 0.1 GB); what it is was not found, so it is not counted.",
    "[1] GB200, TP 4 PP 1: the same job peaks 1.07 GB higher than on H100 (kernels and workspaces "
    "differ); the model has no per-GPU term for it.",
    "[2] replicated: Megatron-LM keeps fp32 main gradients (its table: 20 B per parameter with 16-bit "
    "gradients, 18 with fp32 ones) where ZeRO counts 16 B (2 + 2 + 12): 20/16 = +25%, not an error of the "
    "count of the Megatron job. Sharded: the fp32 gradient copy is sharded too (4 + 16/d against ZeRO's "
    "4 + 12/d), +1%.",
]

# Llama-3-8B's attention (32 heads, 8 query groups) with Megatron-LM's GPT defaults around it
CI_MODEL = {"layers": 32, "hidden": 4096, "ffn_hidden": 16384, "heads": 32, "kv_heads": 8, "vocab": 131073,
            "max_seq": 8192, "mlp": "gelu", "norm": "layernorm", "position": "learned", "tied_embeddings": False,
            "bias": True}
CI_JOBS = {
    "gpt3_7b_tp1_pp4_memory_speed": ({"tp": 1, "pp": 4, "vp": 8, "sp": False}, 1),
    "gpt3_7b_tp4_pp1_memory_speed": ({"tp": 4, "pp": 1, "sp": False}, 2),
}
# (case, platform, mem-max-allocated-bytes, mem-allocated-bytes) at step 25
CI_FIGURES = [
    ("gpt3_7b_tp1_pp4_memory_speed", "DGX H100", 60_518_293_504, 24_540_168_192),
    ("gpt3_7b_tp1_pp4_memory_speed", "DGX GB200", 60_519_342_080, 24_540_168_192),
    ("gpt3_7b_tp4_pp1_memory_speed", "DGX H100", 57_143_791_616, 20_663_519_232),
    ("gpt3_7b_tp4_pp1_memory_speed", "DGX GB200", 58_217_476_096, 20_663_463_936),
]


def job(model: Any, gpus: int, parallel: dict[str, Any], **training: Any) -> JobSpec:
    return JobSpec.model_validate({"model": model, "parallel": parallel, "training": training,
                                   "cluster": {"gpus": gpus, "profile": "h100-sxm-hgx"}})


def row(source: str, config: str, published: float, predicted: float, unit: str) -> str:
    error = 100 * (predicted - published) / published
    return f"| {source} | {config} | {published:,.2f} {unit} | {predicted:,.2f} {unit} | {error:+.1f}% |"


def megatron_ci() -> list[str]:
    rows = []
    for case, platform, peak, after_step in CI_FIGURES:
        parallel, mbs = CI_JOBS[case]
        spec = job(CI_MODEL, 8, parallel, seq=8192, global_batch=8, micro_batch=mbs, dropout=0.1)
        last = memory_by_stage(spec)[-1]
        vp = f" VP {spec.vp}" if spec.vp > 1 else ""
        config = (f"{case}, {platform}, 8 GPUs: TP {parallel['tp']} PP {parallel['pp']}{vp} DP {spec.dp}, "
                  f"seq 8192, MBS {mbs}, GBS 8, bf16, distributed optimizer; last stage")
        rows.append(row("[1] peak", config, peak / GIB, last.total / GIB, "GiB"))
        if platform == "DGX H100":
            states = last.weights + last.gradients + last.optimizer
            rows.append(row("[1] after step", config + ": weights + gradients + optimizer", after_step / GIB,
                            states / GIB, "GiB"))
    return rows


def zero() -> list[str]:
    rows = []
    for dist, published, label in ((False, 120.0, "replicated (baseline DP)"),
                                   (True, 31.4, "P_os (optimizer sharded)")):
        spec = job("gpt-sc21-7.5b", 64, {}, seq=2048, global_batch=64, distributed_optimizer=dist,
                   grad_reduce_dtype="bf16")
        e = memory_by_stage(spec)[0]
        params = e.weights // 2
        config = f"7.5B model, 64 GPUs, {label}; predicted for gpt-sc21-7.5b ({params / 1e9:.2f}B params), bf16 grads"
        rows.append(row("[2] model states", config, published, (e.weights + e.gradients + e.optimizer) / 1e9, "GB"))
    return rows


def bytes_per_param() -> list[str]:
    rows = []
    for grads, dist, published in (("fp32", False, 18), ("fp32", True, 6 + 12 / 8), ("bf16", False, 20),
                                   ("bf16", True, 4 + 16 / 8)):
        spec = job("gpt-sc21-1.7b", 8, {}, seq=2048, global_batch=8, distributed_optimizer=dist,
                   grad_reduce_dtype=grads)
        e = memory_by_stage(spec)[0]
        label = "distributed, d = 8" if dist else "not distributed"
        rows.append(row("[3] bytes/param", f"bf16 params, {grads} grads, {label}", published,
                        (e.weights + e.gradients + e.optimizer) / (e.weights / 2), "B"))
    return rows


def table_2() -> list[str]:
    s, b, h, a, t = 2048, 1, 12288, 96, 8
    sbh = s * b * h
    cases = [("tensor parallel", {"sp": False}, {}, sbh * (10 + 24 / t + 5 * a * s / (h * t)), False),
             ("tensor + sequence parallel", {}, {}, sbh / t * (34 + 5 * a * s / h), False),
             ("TP + SP + selective recompute", {}, {"recompute": "selective"}, 34 * sbh / t, False),
             ("full recompute (TP, no SP)", {"sp": False}, {}, 2 * sbh, True)]
    rows = []
    for label, parallel, training, published, recomputed in cases:
        spec = job("gpt3-175b", t, {"tp": t, **parallel}, seq=s, global_batch=b, micro_batch=b, dropout=0.1,
                   attention="unfused", **training)
        rows.append(row("[4] per layer (formula)", f"GPT-3 175B shape, s 2048, b 1, t 8: {label}",
                        published / 2**20, layer_activations(spec, recomputed) / 2**20, "MiB"))
    return rows


SIMULATED_JOBS = [
    ("[1] gpt3_7b_tp1_pp4_memory_speed", CI_MODEL, 8, {"tp": 1, "pp": 4, "vp": 8, "sp": False},
     {"seq": 8192, "global_batch": 8, "micro_batch": 1, "dropout": 0.1}),
    ("[1] gpt3_7b_tp4_pp1_memory_speed", CI_MODEL, 8, {"tp": 4, "pp": 1, "sp": False},
     {"seq": 8192, "global_batch": 8, "micro_batch": 2, "dropout": 0.1}),
    ("Llama 3 70B, examples/llama3-70b-64gpu.yaml", "llama3-70b", 64,
     {"tp": 4, "pp": 4, "vp": 5, "cp": 2, "tp_comm_overlap": True},
     {"seq": 8192, "global_batch": 128, "micro_batch": 1, "precision": "fp8"}),
    ("SC'21 GPT 7.5B, full recompute, no distributed optimizer", "gpt-sc21-7.5b", 128, {"tp": 4, "pp": 1},
     {"seq": 2048, "global_batch": 512, "micro_batch": 2, "precision": "fp16", "recompute": "full",
      "distributed_optimizer": False, "attention": "unfused"}),
    ("Llama 2 13B, FP8, TP1 PP4 VP10 (NeMo 24.07's layout)", "llama2-13b", 16, {"tp": 1, "pp": 4, "vp": 10},
     {"seq": 4096, "global_batch": 128, "micro_batch": 1, "precision": "fp8", "grad_reduce_dtype": "bf16"}),
    # mixtures of experts: expert weights split over ep x etp, their optimizer over edp, routed activations
    ("Mixtral 8x7B, docs/training.md's layout", "mixtral-8x7b", 64, {"tp": 1, "pp": 4, "vp": 8, "ep": 8},
     {"seq": 4096, "global_batch": 256, "micro_batch": 1}),
    ("Qwen3-30B-A3B, FP8, expert TP 1 beside TP 2", "qwen3-30b-a3b", 16, {"tp": 2, "pp": 2, "ep": 4, "etp": 1},
     {"seq": 4096, "global_batch": 64, "micro_batch": 1, "precision": "fp8", "grad_reduce_dtype": "bf16"}),
]


def simulated() -> list[str]:
    """The prediction against the hbm layer's peak for the same job's traces."""
    from chakra_core import run

    rows = []
    for label, model, gpus, parallel, training in SIMULATED_JOBS:
        data = {"name": "memory", "model": model, "parallel": parallel, "training": training, "tensors": True,
                "cluster": {"gpus": gpus, "profile": "h100-hgx-ndr400"}}
        spec = JobSpec.model_validate(data)
        predicted = max(e.total for e in memory_by_stage(spec))
        with tempfile.TemporaryDirectory() as folder:
            manifest = {"job": data, "output": {"dir": folder}, "compute": {"plugin": "achievable"},
                        "system": {"plugin": "nccl"}, "memory": {"plugin": "hbm"}}
            results = run.simulate(run.load(manifest, base_dir=Path(folder))).document
        peak = results["layers"]["memory"]["summary"]["peak_memory_bytes"]
        p = spec.parallel
        layout = f"TP {p.tp} PP {p.pp}" + (f" VP {p.vp}" if p.vp else "") + (f" CP {p.cp}" if p.cp > 1 else "") \
            + (f" EP {p.ep} ETP {p.expert_tp}" if spec.shape.moe else "")
        rows.append(f"| {label} | {gpus} | {layout} | {predicted / GIB:,.3f} GiB | {peak / GIB:,.3f} GiB | "
                    f"{100 * (peak - predicted) / predicted:+.3f}% |")
    return rows


def main() -> None:
    print("| source | configuration | published | predicted | error |")
    print("|---|---|---:|---:|---:|")
    for line in megatron_ci() + zero() + bytes_per_param() + table_2():
        print(line)
    print()
    print("| job | GPUs | layout | predicted | hbm layer, simulated | difference |")
    print("|---|---:|---|---:|---:|---:|")
    for line in simulated():
        print(line)
    print()
    for note in NOTES:
        print(f"- {note}")
    print()
    for key, text in SOURCES.items():
        print(f"{key} {text}")


if __name__ == "__main__":
    main()
