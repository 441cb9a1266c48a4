"""System layers: the matching base every system layer may build on, and the built-in `native` layer."""
