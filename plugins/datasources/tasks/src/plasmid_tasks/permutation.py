"""A keyed pseudo-random permutation of ``range(size)`` that needs no memory.

The tasks' domains range from 100 prompts (mod10) to 10^20 (addition of 10-digit numbers), too
many to shuffle as a list. A balanced Feistel network over the smallest even number of bits that
covers ``size`` is a bijection on ``range(2**bits)``; "cycle walking" (re-applying it until the
value falls below ``size``) restricts it to a bijection on ``range(size)``. Each position costs a
few BLAKE2 hashes, so an epoch can be walked lazily and resumed from its position alone.
The same key gives the same permutation in every process and on every platform.
"""

from __future__ import annotations

import hashlib

ROUNDS = 4  # four rounds of a pseudo-random function make a pseudo-random permutation (Luby-Rackoff)


class Permutation:
    """``permutation[i]`` is the item at position ``i`` of a shuffle of ``range(size)`` keyed by ``key``."""

    def __init__(self, size: int, key: str) -> None:
        if size < 1:
            raise ValueError(f"cannot permute an empty range (size {size})")
        self.size = size
        bits = max(2, (size - 1).bit_length())
        self._half_bits = (bits + 1) // 2
        self._half_mask = (1 << self._half_bits) - 1
        self._key = hashlib.blake2b(key.encode(), digest_size=32).digest()

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, position: int) -> int:
        if not 0 <= position < self.size:
            raise IndexError(f"position {position} outside range({self.size})")
        value = self._encrypt(position)
        while value >= self.size:  # cycle walking; a few steps on average (the cover is < 4x size)
            value = self._encrypt(value)
        return value

    def _encrypt(self, value: int) -> int:
        left, right = value >> self._half_bits, value & self._half_mask
        for round_number in range(ROUNDS):
            left, right = right, left ^ self._round_function(round_number, right)
        return (left << self._half_bits) | right

    def _round_function(self, round_number: int, half: int) -> int:
        digest = hashlib.blake2b(f"{round_number}:{half}".encode(), key=self._key, digest_size=16).digest()
        return int.from_bytes(digest, "little") & self._half_mask
