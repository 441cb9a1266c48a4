"""`plan --vary`'s comparison: each value's best layout against the first value's.

An architect varies the GPU (a profile), the cluster size or the network to ask how much faster,
and how much cheaper in GPU-hours, a job trains. For each value: its best simulated layout, the
step, tokens per second per GPU and GPU-hours per million tokens, each against the first value's
as a ratio, and what the model's error on published runs like each one (`ErrorBand`,
docs/training-accuracy.md) means for that ratio:

- `bias`: if each value's class of runs keeps its mean signed error, the predicted ratio is off
  by (1 + signed error of this value) / (1 + signed error of the first) - 1 (negative: the
  model favours this value more than the published runs do). Zero when both come from one class.
- `across_domains`: the best layout's communicator roles (tp, cp, ep, dp, pp, ...) whose groups
  span NVLink domains (nodes, or a rack's domain) and so use the network.
- `tie`: the steps differ by less than the larger of the two classes' geomean errors, the rule
  `plan` ranks layouts by: the model cannot tell the two apart.
"""

from __future__ import annotations

import json

from chakra_core.jobs.bands import ErrorBand
from chakra_core.json_types import JsonObject
from chakra_core.plan.search import GIB, SIMULATED, Plan
from chakra_core.sweep.table import table_csv

SECONDS_PER_HOUR = 3600.0
COLUMNS = ["value", "profile", "gpus", "best_layout", "across_domains", "step_s", "step_vs_first", "tokens_per_s_per_gpu",
           "gpu_hours_per_million_tokens", "gpu_hours_vs_first", "tflops_per_gpu", "mfu", "memory_gib",
           "error_band_scope", "error_band_geomean", "error_band_signed", "bias_vs_first", "tie_with_first"]
TEXT = {"value", "profile", "best_layout", "across_domains", "error_band_scope"}
KINDS = {c: "str" if c in TEXT else "int" if c == "gpus" else "bool" if c == "tie_with_first" else "float"
         for c in COLUMNS}


def comparison_rows(summary: list[tuple[str | None, Plan]]) -> list[JsonObject]:
    """One row per --vary value (COLUMNS), the first value's best as the reference; a value with
    no simulated layout (or a step of no time) has its value and profile only."""
    rows: list[JsonObject] = []
    first: tuple[float, float, ErrorBand | None] | None = None
    for label, found in summary:
        row: JsonObject = {"value": label, "profile": found.profile}
        best = next((c for c in found.ranked() if c.status == SIMULATED and c.training is not None), None)
        if best is None or best.training is None or best.training.tokens_per_s_per_gpu <= 0:
            rows.append(row)
            continue
        step = best.training
        gpu_hours = 1e6 / (step.tokens_per_s_per_gpu * SECONDS_PER_HOUR)   # per million tokens
        band = step.error_band
        reference = first is None
        if first is None:
            first = (step.step_time_s, gpu_hours, band)
        first_step, first_hours, first_band = first
        row.update({"gpus": step.gpus, "best_layout": best.layout.label(), "across_domains": step.across_domains,
                    "step_s": step.step_time_s,
                    "step_vs_first": step.step_time_s / first_step, "tokens_per_s_per_gpu": step.tokens_per_s_per_gpu,
                    "gpu_hours_per_million_tokens": gpu_hours, "gpu_hours_vs_first": gpu_hours / first_hours,
                    "tflops_per_gpu": step.tflops_per_gpu, "mfu": step.mfu, "memory_gib": best.memory.total / GIB,
                    "error_band_scope": None if band is None else band.scope,
                    "error_band_geomean": None if band is None else band.geomean_error,
                    "error_band_signed": None if band is None else band.mean_signed_error,
                    **({"bias_vs_first": None, "tie_with_first": None} if reference
                       else _versus(step.step_time_s / first_step, band, first_band))})
        rows.append(row)
    return rows


def _versus(ratio: float, band: ErrorBand | None, first: ErrorBand | None) -> JsonObject:
    if band is None or first is None:
        return {"bias_vs_first": None, "tie_with_first": None}
    bias = 0.0 if band.scope == first.scope else (1 + band.mean_signed_error) / (1 + first.mean_signed_error) - 1
    return {"bias_vs_first": bias, "tie_with_first": abs(ratio - 1) < max(band.geomean_error, first.geomean_error)}


def comparison_files(rows: list[JsonObject]) -> dict[str, str | bytes]:
    """comparison.csv and comparison.json, written beside the values' folders."""
    return {"comparison.csv": table_csv(COLUMNS, rows, KINDS),
            "comparison.json": json.dumps({"reference": next((row["value"] for row in rows if "step_s" in row), None),
                                           "rows": rows},
                                          indent=1, allow_nan=False) + "\n"}


def describe_versus(row: JsonObject, first: JsonObject) -> str | None:
    """A sentence on how a value's best compares with the first value's (None for the first or
    a value without a simulated layout)."""
    ratio, hours = row.get("step_vs_first"), row.get("gpu_hours_vs_first")
    if row is first or not isinstance(ratio, float) or not isinstance(hours, float):
        return None
    text = (f"{row['value']}: the best step is {ratio:.2f}x {first['value']}'s ({_faster(ratio)}), "
            f"{hours:.2f}x the GPU-hours per token")
    bias, tie = row.get("bias_vs_first"), row.get("tie_with_first")
    if isinstance(bias, float) and bias:
        text += (f"; the model's mean signed errors on published runs ({_percent(row['error_band_signed'])} "
                 f"{row['error_band_scope']}, {_percent(first['error_band_signed'])} {first['error_band_scope']}) "
                 f"would put the true ratio {_percent(-bias / (1 + bias))} from this one")
    if tie:
        text += "; within the error band: the model cannot rank the two"
    return text


def _faster(ratio: float) -> str:
    return f"{1 / ratio:.2f}x as fast" if ratio <= 1 else f"{ratio:.2f}x as slow"


def _percent(value: object) -> str:
    return f"{100 * value:+.1f}%" if isinstance(value, float) else "?"
