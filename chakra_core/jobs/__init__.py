"""Training jobs described as people describe them: a model, its parallel layout, a cluster.

`spec` reads the job (YAML or `chakra-sim generate job` options), `models` the named model
presets, `placement` puts ranks on nodes in Megatron's order, `schedule` orders a pipeline
stage's micro-batches (1F1B, interleaved), `program` writes one rank's trace, `flops` counts
model FLOPs as the published tables do, `expand` turns a job manifest into a run, and
`report` splits a simulated step into where its time went. docs/training.md describes them.
"""
