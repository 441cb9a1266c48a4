"""The built-in system layer: collective algorithms, chunking, scheduling, groups, p2p."""
