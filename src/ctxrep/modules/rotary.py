"""Rotary position embeddings (Su et al. 2021) with the context-extension scalings of transformers 5.

A head's pair (x_i, x_{i + d/2}) at position m turns by the angle m * f_i, f_i = theta^(-2i/d) (the "rotate half"
layout of Llama, Qwen, Mistral and Gemma checkpoints):

    R_m x = x * cos(m f) + rotate_half(x) * sin(m f),    rotate_half(x) = (-x_{d/2..d}, x_{0..d/2})

The scalings change the frequencies f (and, for yarn, scale cos and sin by an attention factor), as
transformers' modeling_rope_utils computes them:

    default   f_i = theta^(-2i/d)
    linear    f_i / factor                                                 (Chen et al. 2023, position interpolation)
    dynamic   theta' = theta (factor s / L - (factor - 1))^(d / (d - 2)) when the longest position s exceeds the
              model's L positions, else default ("dynamic NTK")
    yarn      a ramp between f_i and f_i / factor over the dimensions whose wavelength lies between beta_fast and
              beta_slow rotations of the original context; cos, sin times 0.1 ln(factor) + 1 (Peng et al. 2023)
    llama3    f_i / factor above a wavelength of L_orig / low_freq_factor, f_i below L_orig / high_freq_factor,
              smoothly between (Llama 3.1)

Any other rope_type is refused in one line when the config is read (`RopeSpec.from_hf`), before weights load.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")


class RopeError(ValueError):
    """A rope_scaling / rope_parameters entry that ctxrep does not implement or that lacks a key."""


@dataclass(frozen=True)
class RopeSpec:
    """One rotary setting, as transformers 5's rope_parameters (or 4.x's rope_theta + rope_scaling) write it."""

    theta: float = 10_000.0
    rope_type: str = "default"
    factor: float = 1.0
    original_max_position_embeddings: int | None = None
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    attention_factor: float | None = None  # yarn: None = 0.1 ln(factor) + 1 (or from mscale, mscale_all_dim)
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True  # yarn

    @classmethod
    def from_hf(cls, params: dict | None, theta: float, where: str) -> RopeSpec:
        """A spec from one rope_parameters / rope_scaling dict (None: plain RoPE with `theta`); an unknown
        rope_type or a missing key is a RopeError naming `where` (the config file)."""
        p = dict(params or {})
        kind = p.get("rope_type", p.get("type", "default"))
        if kind not in ROPE_TYPES:
            raise RopeError(
                f"{where}: rope scaling type {kind!r} is not implemented by ctxrep (it implements "
                f"{', '.join(ROPE_TYPES)}); nothing was loaded"
            )
        if kind != "default" and p.get("factor") is None:
            raise RopeError(f"{where}: rope scaling type {kind!r} needs a 'factor'; nothing was loaded")
        if p.get("partial_rotary_factor") not in (None, 1, 1.0):
            raise RopeError(f"{where}: partial_rotary_factor {p['partial_rotary_factor']} is not implemented by ctxrep")
        known = {k: p[k] for k in cls.__dataclass_fields__ if k in p and p[k] is not None}
        known.pop("rope_type", None)
        return cls(theta=float(p.get("rope_theta") or theta), rope_type=kind, **known)

    def to_hf(self) -> dict:
        """transformers 5's rope_parameters dict for this spec."""
        out: dict = {"rope_type": self.rope_type, "rope_theta": self.theta}
        if self.rope_type == "default":
            return out
        out["factor"] = self.factor
        if self.rope_type in ("yarn", "llama3") and self.original_max_position_embeddings is not None:
            out["original_max_position_embeddings"] = self.original_max_position_embeddings
        if self.rope_type == "llama3":
            out |= {"low_freq_factor": self.low_freq_factor, "high_freq_factor": self.high_freq_factor}
        if self.rope_type == "yarn":
            out |= {"beta_fast": self.beta_fast, "beta_slow": self.beta_slow, "truncate": self.truncate}
            for key in ("attention_factor", "mscale", "mscale_all_dim"):
                if getattr(self, key) is not None:
                    out[key] = getattr(self, key)
        return out

    def frequencies(self, dim: int, max_positions: int, longest: int) -> tuple[torch.Tensor, float]:
        """(f, attention scaling): f (dim / 2,) float32 for a head of `dim` in a model of `max_positions`
        positions whose batch reaches position `longest` - 1 (only "dynamic" reads it)."""
        base = self.theta
        if self.rope_type == "dynamic" and longest > max_positions:
            base *= (self.factor * longest / max_positions - (self.factor - 1)) ** (dim / (dim - 2))
        inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))  # (dim / 2,)
        if self.rope_type == "linear":
            return inv / self.factor, 1.0
        if self.rope_type == "llama3":
            return self._llama3(inv, max_positions), 1.0
        if self.rope_type == "yarn":
            return self._yarn(dim, max_positions)
        return inv, 1.0

    def _llama3(self, inv: torch.Tensor, max_positions: int) -> torch.Tensor:
        old = self.original_max_position_embeddings or max_positions
        low_wavelen, high_wavelen = old / self.low_freq_factor, old / self.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / self.factor, inv)
        smooth = (old / wavelen - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)
        smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)

    def _yarn(self, dim: int, max_positions: int) -> tuple[torch.Tensor, float]:
        old = self.original_max_position_embeddings or max_positions
        factor = self.factor

        def mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        attention = self.attention_factor
        if attention is None:
            if self.mscale and self.mscale_all_dim:
                attention = mscale(factor, self.mscale) / mscale(factor, self.mscale_all_dim)
            else:
                attention = mscale(factor)

        def correction_dim(rotations: float) -> float:
            return (dim * math.log(old / (rotations * 2 * math.pi))) / (2 * math.log(self.theta))

        low, high = correction_dim(self.beta_fast), correction_dim(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001  # no zero-width ramp
        ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        pos = self.theta ** (torch.arange(0, dim, 2).float() / dim)
        extrapolation = 1 - ramp  # share of the unscaled frequency
        inv = (1.0 / (factor * pos)) * (1 - extrapolation) + (1.0 / pos) * extrapolation
        return inv, float(attention)


def rotary_cos_sin(
    spec: RopeSpec, dim: int, max_positions: int, positions: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of m * f for the positions m (batch, seq): each (batch, seq, dim), the dim / 2 angles twice
    (rotate-half layout), computed in float32 and cast to `dtype` as transformers does. Dynamic scaling reads the
    batch's length (seq), as transformers' does from its positions 0..seq - 1."""
    inv, scaling = spec.frequencies(dim, max_positions, positions.shape[-1])
    angles = positions[..., None].float() * inv.to(positions.device)  # (batch, seq, dim / 2)
    angles = torch.cat([angles, angles], dim=-1)  # (batch, seq, dim)
    return (angles.cos() * scaling).to(dtype), (angles.sin() * scaling).to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """R_m x for x (..., heads, dim) and cos, sin (..., dim): (batch, seq, heads, dim) with (batch, seq, dim), or
    the real tokens of an unpadded batch, (tokens, heads, dim) with (tokens, dim)."""
    cos, sin = cos[..., None, :], sin[..., None, :]  # (..., 1, dim)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)  # rotate_half(x)
    return x * cos + rotated * sin
