"""Synthetic Chakra traces (`chakra-sim generate ...`).

`generate microbenchmark` writes ASTRA-sim's collective microbenchmarks and point-to-point
patterns (`microbenchmark`); `generate job` writes a Megatron-LM training step (chakra_core.jobs)
from a job file or options (`job`), and `generate transformer` is a front over it for a GPT
given by its shape (`transformer`: the flags become a job). `cli` holds the click group;
`errors` the error they raise.

All are deterministic: the same arguments give byte-identical files.
"""

from chakra_core.tools.generate.cli import generate
from chakra_core.tools.generate.errors import GeneratorError
from chakra_core.tools.generate.microbenchmark import (COLLECTIVES, P2P_PATTERNS, ROOTED, microbenchmark_traces,
                                                       p2p_rounds, size_label, write_microbenchmark)
from chakra_core.tools.generate.transformer import transformer_job

__all__ = [
    "COLLECTIVES", "GeneratorError", "P2P_PATTERNS", "ROOTED", "generate", "microbenchmark_traces", "p2p_rounds",
    "size_label", "transformer_job", "write_microbenchmark",
]
