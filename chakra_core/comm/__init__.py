"""The collective toolkit system layers and checks share.

- `groups`: communicator groups (manifest / ASTRA-sim files, METADATA nodes) and their shapes;
- `collectives`: collective types and how a collective node is read (type, size, group, root);
- `matcher`: the k-th collective a rank issues in a group matches the k-th of every other member;
- `p2p`: sends and receives matched by (src, dst, tag).

The built-in `native` system layer, the `nccl` plugin and `chakra-sim validate` all match
collectives through these, so a run and a check give one answer.
"""
