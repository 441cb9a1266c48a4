"""chakra-sim core: Chakra execution traces, the plugin contract and the simulation engine."""

__version__ = "0.1.0"
