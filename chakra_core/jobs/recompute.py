"""What Megatron-Core refuses of selective recomputation's module list."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from chakra_core.jobs.spec import JobSpec


def recompute_problems(job: JobSpec) -> list[str]:
    """recompute_modules as Megatron-Core takes them (transformer_config.py at d98e8a64)."""
    t = job.training
    if t.recompute_modules is None:
        return []
    out = []
    if t.recompute != "selective":
        out.append("training.recompute_modules needs recompute: selective")
    dropped = sorted({"layernorm", "moe_act"} & set(t.recompute_modules))
    if dropped and t.precision in ("fp8", "nvfp4"):
        # delayed scaling: "Delayed scaling does not support moe_act and layernorm recompute for fp8";
        # current scaling keeps their bf16 inputs instead (set_save_original_input), not modelled
        out.append(f"training.recompute_modules {', '.join(dropped)} with precision fp8 is not modelled (Megatron "
                   "refuses it with delayed scaling)")
    return out
