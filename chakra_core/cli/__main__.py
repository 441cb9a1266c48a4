"""`python -m chakra_core.cli` is `chakra-sim`."""

from chakra_core.cli import main

main()
