"""Discrete-event engine: event queue, per-rank workload drivers, simulation runs."""
