"""`chakra-sim synthesize`: representative synthetic traces from a statistical model of real ones.

    model.py   the JSON model and its validation
    fit.py     traces -> model
    sample.py  model -> traces, at any rank count and length, deterministic for a seed
    cli.py     the command

docs/synthesis.md is the user guide, with the accuracy figures of benchmarks/synthesis.py.
"""
