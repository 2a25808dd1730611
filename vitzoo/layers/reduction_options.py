"""The options of ``model.token_reduction`` (one dataclass per reducer, checked on construction) and EViT's
keep-rate schedule; the reducers themselves are in :mod:`vitzoo.layers.token_reduction`."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from vitzoo.attention.base import check


@dataclass
class ToMeConfig:
    r: int = 8  # tokens merged in every block (fewer when fewer than 2r tokens remain)

    def __post_init__(self):
        _check_positive_int(self, "r")


@dataclass
class EViTConfig:
    keep_rate: float = 0.7  # fraction of the non-class tokens kept at each reducing block (the paper's 0.7)
    locations: Optional[list[int]] = None  # reducing blocks; null = every third from block 3 (the paper's 3, 6, 9)
    warmup_start: float = 0.0  # epochs trained at keep rate 1 before the warm-up (the authors' ImageNet recipe: 10)
    warmup_epochs: float = 1.0  # epochs of the cosine from 1 down to keep_rate (theirs: 100 of 300); 0: no warm-up

    def __post_init__(self):
        check(_is_number(self.keep_rate) and 0 < self.keep_rate <= 1,
              f"model.token_reduction.keep_rate must be in (0, 1] (got {self.keep_rate!r})")
        if self.locations is not None:
            self.locations = list(self.locations)
            check(all(isinstance(i, int) and i >= 0 for i in self.locations),
                  f"model.token_reduction.locations must be block indices >= 0 (got {self.locations!r})")
        for name in ("warmup_start", "warmup_epochs"):
            value = getattr(self, name)
            check(_is_number(value) and math.isfinite(value) and value >= 0,
                  f"model.token_reduction.{name} must be a number of epochs >= 0 (got {value!r})")

    def rate_at(self, epoch: float) -> float:
        """The training keep rate after ``epoch`` epochs (fractional: the schedule moves every step).

        The paper's warm-up as its released code computes it (``adjust_keep_rate``): with s = ``warmup_start``, w =
        ``warmup_epochs`` and r = ``keep_rate``, the rate is 1 while ``epoch < s``, then
        ``r + (1 − r)·(1 + cos(π·(epoch − s)/w))/2`` (a half cosine from 1 down to r), and r from
        ``epoch ≥ s + w`` on.

        Args:
            epoch: epochs of training done before the step (optimizer steps / steps per epoch).
        """
        start, length, target = float(self.warmup_start), float(self.warmup_epochs), float(self.keep_rate)
        if epoch < start:
            return 1.0
        if epoch >= start + length:
            return target
        return target + (1.0 - target) * (1.0 + math.cos(math.pi * (epoch - start) / length)) / 2


@dataclass
class TokenLearnerConfig:
    num_tokens: int = 8  # S learned tokens (the paper's 8); at most the grid's token count
    location: Optional[int] = None  # the block the tokens are learned before; null = depth // 2
    hidden_dim: int = 64  # D: hidden width of the MLP that computes the maps (the paper's bottleneck, 64)

    def __post_init__(self):
        _check_positive_int(self, "num_tokens")
        _check_positive_int(self, "hidden_dim")
        if self.location is not None:
            check(isinstance(self.location, int) and self.location >= 0,
                  f"model.token_reduction.location must be a block index >= 0 (got {self.location!r})")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_positive_int(cfg: Any, name: str) -> None:
    value = getattr(cfg, name)
    check(isinstance(value, int) and not isinstance(value, bool) and value > 0,
          f"model.token_reduction.{name} must be a positive integer (got {value!r})")


def check_no_growth(cfg: Any, grid_tokens: int) -> None:
    """A one-line ConfigError where an option would make the sequence longer than the token grid.

    ToMe merges at most half the tokens and EViT's keep rate is at most 1 (both checked on construction);
    TokenLearner's S learned tokens replace the grid tokens, so S may not exceed them.

    Args:
        cfg: a reducer's options; grid_tokens: the model's grid tokens (prefix tokens not counted).
    """
    if isinstance(cfg, TokenLearnerConfig):
        check(cfg.num_tokens <= grid_tokens,
              f"model.token_reduction.num_tokens must be at most the grid's {grid_tokens} tokens: a token reducer "
              f"never lengthens the sequence (got {cfg.num_tokens})")


__all__ = ["EViTConfig", "ToMeConfig", "TokenLearnerConfig", "check_no_growth"]
