"""ECMP keys: the hash of a message's (source, destination, sequence number), and the per-pair
message counters that give the sequence numbers (fabric.py's router reads them)."""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


def ecmp_hash(src: int, dst: int, seq: int) -> int:
    """The `hash` ECMP key of the seq-th message from src to dst: MurmurHash3's fmix32 of
    (src * 0x9E3779B1 + dst * 0x85EBCA77 + seq * 0xC2B2AE3D) mod 2^32."""
    h = (src * 0x9E3779B1 + dst * 0x85EBCA77 + seq * 0xC2B2AE3D) & 0xFFFFFFFF
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


class PairCounter:
    """Messages sent so far per (src, dst), modulo `modulus`: a dict per source while it has few
    peers, then an array over all NPUs (1, 2 or 4 bytes each, as the modulus needs) once a dict
    would be larger. Only pairs that exchange messages cost memory."""

    def __init__(self, npus: int, modulus: int = 1 << 32) -> None:
        self.modulus = modulus
        self._code = "B" if modulus <= 1 << 8 else "H" if modulus <= 1 << 16 else "I"
        self._npus = npus
        self._sent: list[dict[int, int] | array[int] | None] = [None] * npus
        self._dense_after = max(npus // 16, 1)

    def next(self, src: int, dst: int) -> int:
        """The number of messages from src to dst so far (mod modulus); counts one more."""
        sent = self._sent[src]
        if sent is None:
            sent = self._sent[src] = {}
        if isinstance(sent, dict):
            seq = sent.get(dst, 0)
            sent[dst] = (seq + 1) % self.modulus
            if len(sent) > self._dense_after:
                dense = self._sent[src] = array(self._code, [0]) * self._npus
                for peer, count in sent.items():
                    dense[peer] = count
        else:
            seq = sent[dst]
            sent[dst] = (seq + 1) % self.modulus
        return seq

    def advance_many(self, src: int, dsts: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """`next` counts[i] times for each (src, dsts[i]) (dsts distinct): each pair's count
        before (numpy arrays)."""
        import numpy as np

        sent = self._sent[src]
        if sent is None or isinstance(sent, dict):
            if len(dsts) + len(sent or ()) <= self._dense_after:
                table = sent if sent is not None else {}
                self._sent[src] = table
                before = np.fromiter((table.get(int(d), 0) for d in dsts), dtype=np.int64, count=len(dsts))
                for d, value in zip(dsts.tolist(), ((before + counts) % self.modulus).tolist()):
                    table[d] = value
                return before
            dense = array(self._code, [0]) * self._npus
            for peer, count in (sent or {}).items():
                dense[peer] = count
            sent = self._sent[src] = dense
        view = np.frombuffer(sent, dtype=np.dtype(self._code))
        counted: np.ndarray = view[dsts].astype(np.int64)
        view[dsts] = (counted + counts) % self.modulus
        return counted
