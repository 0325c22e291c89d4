"""How long the device's forward takes lately: CUDA events around each step's launch, read a step
later (by then done, so reading them never waits). The guided rows of a step are computed while
the device runs its forward; waiting on them past its end stalls the whole batch, so the step's
allowance for new mask work follows this (engine/guided.py)."""
from dataclasses import dataclass, field

import torch

DECAY = 0.8  # weight of the estimate so far against a new step's forward


@dataclass
class ForwardClock:
    cuda: bool
    estimate_s: float | None = None  # None: no forward timed yet (or not on CUDA)
    _pending: tuple | None = field(default=None, repr=False)

    @classmethod
    def of(cls, device: torch.device) -> "ForwardClock":
        return cls(device.type == "cuda")

    def start(self) -> None:
        """Before the step's forward is launched."""
        if self.cuda:
            self._read()
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._pending = (event, None)

    def stop(self) -> None:
        """After the step's forward is launched."""
        if self._pending is not None:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._pending = (self._pending[0], event)

    def _read(self) -> None:
        if self._pending is None or self._pending[1] is None or not self._pending[1].query():
            return
        seconds = self._pending[0].elapsed_time(self._pending[1]) / 1e3
        self._pending = None
        self.estimate_s = seconds if self.estimate_s is None else DECAY * self.estimate_s + (1 - DECAY) * seconds
