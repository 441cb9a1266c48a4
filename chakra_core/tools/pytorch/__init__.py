"""Converting PyTorch execution traces (host ET JSON, optionally with a Kineto trace) to Chakra .et.

    from chakra_core.tools.pytorch import convert
    result = convert("host.json.gz", kineto_path="kineto.json.gz")
    result.write("traces/model")          # traces/model.<rank>.et

Modules, in pipeline order: `host` (reading host traces of every schema), `kineto` (reading
Kineto traces), `units` (which scopes become nodes), `ops` (tensors, bytes, writes), `flops`
(FLOP estimates), `comms` (communication operators and process groups), `link` (host <-> Kineto),
`deps` (edges and cycle breaking), `job` (the job's process groups and the rank), `nodes`
(building the nodes), `convert` (the conversion and its dependencies), `result` (what it gives,
written by `Conversion.write`), `cli` (the `convert pytorch` command).
docs/converter.md is the user guide.
"""

from chakra_core.tools.pytorch.convert import convert
from chakra_core.tools.pytorch.result import Conversion, Summary
from chakra_core.tools.pytorch.errors import ConversionError

__all__ = ["Conversion", "ConversionError", "Summary", "convert"]
