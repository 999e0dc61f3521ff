"""Counter-based hashing for the plans: pure functions of (seed, words).

The splitmix64 finaliser chained over its inputs, and a keyed Feistel
permutation, written with operators that behave the same on Python ints and on
``uint64`` numpy arrays, so a plan's scalar path (called per chunk) and its
vectorised path agree bit for bit.
"""

from __future__ import annotations

import functools

import numpy as np

__all__ = [
    "FEISTEL_ROUNDS",
    "GOLDEN",
    "M64",
    "feistel",
    "half_bits",
    "hash_words",
    "mix",
    "permute",
    "round_keys",
    "seed_key",
]

M64 = 0xFFFF_FFFF_FFFF_FFFF
GOLDEN = 0x9E37_79B9_7F4A_7C15
FEISTEL_ROUNDS = 6


def mix(x):
    """splitmix64 finaliser: a bijection on 64-bit words with full avalanche."""
    x = ((x ^ (x >> 30)) * 0xBF58_476D_1CE4_E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D0_49BB_1331_11EB) & M64
    return x ^ (x >> 31)


def hash_words(key, *words):
    """Chain ``words`` into ``key``; for a fixed prefix each word maps bijectively."""
    h = key
    for word in words:
        h = mix(((h + GOLDEN) & M64) ^ word)
    return h


@functools.lru_cache(maxsize=64)
def seed_key(seed: int) -> int:
    """Fold a seed of any size into one 64-bit key (limb by limb, so no two collide
    by truncation)."""
    key = mix(GOLDEN)
    while True:
        key = hash_words(key, seed & M64)
        seed >>= 64
        if not seed:
            return key


def feistel(x, half_bits: int, round_keys):
    """One pass of a balanced Feistel network on ``2 * half_bits``-bit values."""
    mask = (1 << half_bits) - 1
    left, right = x >> half_bits, x & mask
    for key in round_keys:
        left, right = right, left ^ (mix(right ^ key) & mask)
    return (left << half_bits) | right


def half_bits(n: int) -> int:
    return max(1, ((n - 1).bit_length() + 1) // 2)


def round_keys(base):
    # The offsets are reduced first: a Python int above 2**64 cannot meet a uint64 array.
    return [mix((base + ((r + 1) * GOLDEN & M64)) & M64) for r in range(FEISTEL_ROUNDS)]


def permute(x, n: int, base):
    """A keyed permutation of ``[0, n)``: a Feistel pass on the next power of four, cycle
    walking (at most a few steps on average, < 4) until the value lies below ``n``.

    ``x``: uint64 values in ``[0, n)``; ``base``: a uint64 key per value (same shape).
    O(1) per value and no table, so ``n`` may be in the millions.
    """
    if n <= 1:
        return x
    bits, keys = half_bits(n), round_keys(base)
    y = x.copy()
    todo = np.arange(y.size)
    while todo.size:
        y[todo] = feistel(y[todo], bits, [key[todo] for key in keys])
        todo = todo[y[todo] >= n]
    return y
