"""Synthetic Chakra traces (`chakra-sim generate ...`).

`generate microbenchmark` writes ASTRA-sim's collective microbenchmarks and point-to-point
patterns (`microbenchmark`); `generate transformer` writes model-based pre-execution traces of a
Megatron-style GPT training iteration under data, tensor (optionally sequence) and pipeline
parallelism (`transformer_config`: the configuration and its sizes; `rank`: a rank's tensors and
the nodes its program is built from; `transformer`: the program and the files). `cli` holds the
click group; `errors` the error they raise.

Both are deterministic: the same arguments give byte-identical files.
"""

from chakra_core.tools.generate.cli import generate
from chakra_core.tools.generate.errors import GeneratorError
from chakra_core.tools.generate.microbenchmark import (COLLECTIVES, P2P_PATTERNS, ROOTED, microbenchmark_traces,
                                                       p2p_rounds, size_label, write_microbenchmark)
from chakra_core.tools.generate.transformer import (iter_transformer_traces, transformer_metadata,
                                                    transformer_traces, write_transformer)
from chakra_core.tools.generate.transformer_config import (ADAM_STATES, DEVICE, DTYPE_BYTES,
                                                           OPTIMIZER_FP32_STATE_BYTES, OPTIMIZER_OPS_PER_PARAM,
                                                           TENSOR_TYPES, TransformerConfig)

__all__ = [
    "ADAM_STATES", "COLLECTIVES", "DEVICE", "DTYPE_BYTES", "GeneratorError", "OPTIMIZER_FP32_STATE_BYTES",
    "OPTIMIZER_OPS_PER_PARAM", "P2P_PATTERNS", "ROOTED", "TENSOR_TYPES", "TransformerConfig", "generate",
    "iter_transformer_traces", "microbenchmark_traces", "p2p_rounds", "size_label", "transformer_metadata",
    "transformer_traces", "write_microbenchmark", "write_transformer",
]
