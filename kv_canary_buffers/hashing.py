"""The canary's hashes (docs/contract.md, "Hashes"), in torch and in plain Python.

All arithmetic is mod ``2**64`` on the int64 bit pattern. torch has no unsigned 64-bit
shift, so a logical right shift is an arithmetic one with the sign-extended bits masked
off; int64 multiplication wraps, which is the mod-``2**64`` product.
"""

from __future__ import annotations

import torch

from .layout import ANCHOR_SEED, H0, SM_MUL1, SM_MUL2, SM_SHIFTS

_MASK64 = (1 << 64) - 1


def to_signed(value: int) -> int:
    """The int64 with the same low 64 bits as ``value``."""
    value &= _MASK64
    return value - (1 << 64) if value >> 63 else value


def to_unsigned(value: int) -> int:
    """The low 64 bits of ``value`` as a non-negative int (for hex display)."""
    return value & _MASK64


# --- plain Python (tests, decoding, the docs' check values) ------------------------
def sm_int(x: int) -> int:
    """SplitMix64's finaliser of the contract on a Python int; returns the signed int64."""
    s1, s2, s3 = SM_SHIFTS
    x &= _MASK64
    x ^= x >> s1
    x = (x * SM_MUL1) & _MASK64
    x ^= x >> s2
    x = (x * SM_MUL2) & _MASK64
    x ^= x >> s3
    return to_signed(x)


def mix3_int(a: int, b: int, c: int) -> int:
    """``sm(sm(sm(a) ^ b) ^ c)`` on Python ints; returns the signed int64."""
    return sm_int(sm_int(sm_int(a) ^ b) ^ c)


H0_SIGNED = to_signed(H0)
"""The anchor ``H0`` as the signed int64 a record stores."""
assert sm_int(ANCHOR_SEED) == H0_SIGNED

_MUL1 = to_signed(SM_MUL1)
_MUL2 = to_signed(SM_MUL2)
_LOW_MASKS = {k: (1 << (64 - k)) - 1 for k in SM_SHIFTS}


# --- torch (the references) ----------------------------------------------------------
def _srl(x: torch.Tensor, k: int) -> torch.Tensor:
    return (x >> k) & _LOW_MASKS[k]


def sm(x: torch.Tensor) -> torch.Tensor:
    """The contract's ``sm`` on an int64 tensor (elementwise, a new tensor)."""
    s1, s2, s3 = SM_SHIFTS
    x = x ^ _srl(x, s1)
    x = x * _MUL1
    x = x ^ _srl(x, s2)
    x = x * _MUL2
    return x ^ _srl(x, s3)


def mix3(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``sm(sm(sm(a) ^ b) ^ c)`` elementwise on int64 tensors."""
    return sm(sm(sm(a) ^ b) ^ c)
