"""Whether a job's layers fit the 64-bit fields of a Chakra trace."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from chakra_core.jobs.spec import JobSpec


INT64_MAX = (1 << 63) - 1
"""The largest size or operation count a Chakra trace holds (int64 attributes such as comm_size)."""


def overflow(job: JobSpec) -> tuple[str, str] | None:
    """(key path, reason) when one of the job's layers is larger than a trace can hold: checked
    before the first rank is generated, naming the largest factor of the product."""
    m, t = job.shape, job.training
    factors = {"training.seq": t.seq, "training.micro_batch": t.micro_batch, "model.hidden": m.hidden,
               "model.ffn_hidden": m.ffn_hidden, "model.vocab": m.vocab}
    rows = t.micro_batch * t.seq
    for what, value in (("activation", rows * m.hidden * 4),   # bytes, fp32 at most
                        ("GEMM", 2 * rows * m.hidden * max(m.ffn_hidden, m.vocab)),
                        ("attention", 4 * rows * t.seq * m.hidden)):
        if value > INT64_MAX:
            key = max(factors, key=lambda k: factors[k])
            unit = "bytes" if what == "activation" else "FLOPs"
            return (f"job.{key}", f"{factors[key]}: a layer's {what} is {value:.2g} {unit} (micro_batch "
                                  f"{t.micro_batch} x seq {t.seq} x hidden {m.hidden} ...), more than the "
                                  f"2^63-1 a Chakra trace's 64-bit fields hold")
    return None
