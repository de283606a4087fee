"""Mixture-of-experts decoders: Mixtral, Qwen2-MoE, Qwen3-MoE."""

from __future__ import annotations

MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe")


def trace(t, c, batch, seq, opts, padding):
    raise NotImplementedError
