"""Deterministic uniforms from integer keys: ``uniform(*keys)`` (splitmix64 over the keys),
the simulator's one source of seeded draws (response lengths, request failures, rewards,
injected faults), so the same sample gets the same draw whatever the schedule.

Simulations ask for ``uniform(seed, index[, retry])`` for every sample index in turn, and
Python's 64-bit arithmetic costs about a microsecond per key. So values of two keys (and of
three with a third key 0) come in blocks of ``2**BLOCK_BITS`` consecutive second keys
(``uniform_block``), computed with numpy's uint64 arithmetic (the same wrap-around modulo
2**64 as the masked Python ints, and the same exact conversion to float), and the most
recent ``MAX_BLOCKS`` blocks are kept. ``splitmix_uniform`` is the definition.
"""

from __future__ import annotations

import numpy as np

MASK64 = (1 << 64) - 1


def splitmix_uniform(keys: tuple[int, ...]) -> float:
    """The definition of ``uniform`` (splitmix64 over the keys)."""
    x = 0x9E3779B97F4A7C15
    for k in keys:
        x = (x ^ (k & MASK64)) * 0xBF58476D1CE4E5B9 & MASK64
        x = (x ^ (x >> 27)) * 0x94D049BB133111EB & MASK64
        x ^= x >> 31
    return ((x >> 11) + 0.5) / float(1 << 53)


# Speed trick, uniforms in numpy blocks: 1.173x samples per CPU-s (results/bench/sim_tricks_ab.json)
BLOCK_BITS = 10
BLOCK_MASK = (1 << BLOCK_BITS) - 1
MAX_BLOCKS = 64
_BLOCKS: dict[tuple[int, ...], list[float]] = {}
_C1, _C2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S11, _S27, _S31 = np.uint64(11), np.uint64(27), np.uint64(31)


def uniform_block(key: tuple[int, ...]) -> list[float]:
    """``[uniform(k0, k, *tail) for k in block b]`` for ``key = (k0, b, *tail)``."""
    k0, b, tail = key[0], key[1], key[2:]
    x0 = 0x9E3779B97F4A7C15
    x0 = (x0 ^ (k0 & MASK64)) * 0xBF58476D1CE4E5B9 & MASK64
    x0 = (x0 ^ (x0 >> 27)) * 0x94D049BB133111EB & MASK64
    x0 ^= x0 >> 31
    x = np.arange(b << BLOCK_BITS, (b + 1) << BLOCK_BITS, dtype=np.uint64) ^ np.uint64(x0)
    for k in (None, *tail):
        if k is not None:
            x = x ^ np.uint64(k & MASK64)
        x = x * _C1
        x = (x ^ (x >> _S27)) * _C2
        x ^= x >> _S31
    values = (((x >> _S11).astype(np.float64) + 0.5) / float(1 << 53)).tolist()
    if len(_BLOCKS) >= MAX_BLOCKS:
        del _BLOCKS[next(iter(_BLOCKS))]  # the oldest block
    _BLOCKS[key] = values
    return values


def uniform(*keys: int) -> float:
    """A deterministic uniform in (0, 1) from integer keys (splitmix64)."""
    if len(keys) == 2:
        k0, k1 = keys
        if type(k0) is int and type(k1) is int and 0 <= k1 < 1 << 62:
            key = (k0, k1 >> BLOCK_BITS)
            values = _BLOCKS.get(key)
            return (values or uniform_block(key))[k1 & BLOCK_MASK]
    elif len(keys) == 3:
        return uniform3(*keys)
    return splitmix_uniform(keys)


def uniform3(k0: int, k1: int, k2: int) -> float:
    """``uniform(k0, k1, k2)`` (one call per generate request). A third key other than 0
    (a retry count) is rare and scattered: computed alone, not as a block."""
    if k2 == 0 and type(k0) is int and type(k1) is int and type(k2) is int and 0 <= k1 < 1 << 62:
        key = (k0, k1 >> BLOCK_BITS, k2)
        values = _BLOCKS.get(key)
        return (values or uniform_block(key))[k1 & BLOCK_MASK]
    return splitmix_uniform((k0, k1, k2))
