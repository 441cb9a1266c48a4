"""Hardware profiles: GPUs, nodes and networks as data, every value with its public source."""
