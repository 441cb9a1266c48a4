"""Results: the results document, JSON/CSV writers, terminal summary."""
