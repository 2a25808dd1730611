"""Counters of a whole run across its segments (the first process and every ``ckpt_path=auto`` resume): wall time,
the training peak memory and the segment count. Each is a Lightning callback whose state rides in every checkpoint
and is taken over only when a fit resumes from it, so the figures in ``results.json`` cover all segments, each
counted once. Training throughput (:class:`vitzoo.training.callbacks.ImagesPerSecond`) carries over the same way.

The timers read :func:`wall_clock` unless they are given a clock, so tests drive them with a fake one.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Optional

import pytorch_lightning as pl
from pytorch_lightning.trainer.states import TrainerFn

Clock = Callable[[], float]


def wall_clock() -> float:
    """Seconds of a monotonic wall clock (``time.perf_counter``): what the run's timers read by default."""
    return time.perf_counter()


class FitState(pl.Callback):
    """A callback whose checkpoint state is restored only when a fit resumes: ``trainer.validate(ckpt_path=...)``
    loads the same checkpoint to evaluate its weights, and must neither rewind nor add to the run's counters.
    Subclasses define :meth:`restore`."""

    fitting = True  # whether the checkpoint being loaded resumes a fit (set just before load_state_dict)

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        self.fitting = trainer.state.fn == TrainerFn.FITTING

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.fitting:
            self.restore(state_dict)

    def restore(self, state_dict: dict[str, Any]) -> None:
        """Take over the counters of the checkpoint that a fit resumes from.

        Args:
            state_dict: what :meth:`state_dict` returned when the checkpoint was written.
        """
        raise NotImplementedError(f"{type(self).__name__} must define restore()")


class ElapsedTime(FitState):
    """The run's wall-clock seconds over all its segments, each counted once: a checkpoint stores the seconds up
    to its writing, and a resumed fit counts on from them. Work lost after the last checkpoint of a killed run is
    not counted (it is done again). Lightning's ``Timer`` counts only the training stage and is the one
    ``trainer.max_time`` adds, so this counter has its own checkpoint key.

    Args:
        clock: seconds of a monotonic clock (None: :func:`wall_clock`).
    """

    def __init__(self, clock: Optional[Clock] = None) -> None:
        self.clock = clock or wall_clock
        self.start = self.clock()
        self.before = 0.0  # seconds of the earlier segments, from the checkpoint resumed
        self.segments = 1  # processes that trained this run, this one included

    def seconds(self) -> float:
        """Seconds of the earlier segments plus this process's since the callback was made."""
        return self.before + self.clock() - self.start

    def state_dict(self) -> dict[str, Any]:
        return {"seconds": self.seconds(), "segments": self.segments}

    def restore(self, state_dict: dict[str, Any]) -> None:
        self.before = float(state_dict.get("seconds", 0.0))
        self.segments = int(state_dict.get("segments", 1)) + 1


class TrainingPeakMemory(FitState):
    """The training peak memory over all segments: the largest of this process's peak and those the checkpoint
    resumed from holds.

    Args:
        peak_mb: this process's training peak so far in MiB (e.g. :meth:`vitzoo.measure.memory.PeakMemory.peak_mb`,
            also settable later as :attr:`this_process`); None: 0 until it is set.
    """

    def __init__(self, peak_mb: Optional[Callable[[], float]] = None) -> None:
        self.this_process = peak_mb or (lambda: 0.0)
        self.before = 0.0  # the largest peak of the earlier segments

    def peak_mb(self) -> float:
        """MiB: the largest training peak of any segment so far."""
        return max(self.before, float(self.this_process()))

    def state_dict(self) -> dict[str, Any]:
        return {"peak_mb": self.peak_mb()}

    def restore(self, state_dict: dict[str, Any]) -> None:
        self.before = float(state_dict.get("peak_mb", 0.0))
