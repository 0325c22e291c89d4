import dataclasses
import functools
import gc

import torch


def reject_unknown_fields(what: str):
    """Class decorator for a dataclass: an unknown keyword raises ValueError naming it (the
    dataclass __init__ raises TypeError), so the API layer can answer HTTP 400."""
    def wrap(cls):
        names = tuple(f.name for f in dataclasses.fields(cls))
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            unknown = sorted(kwargs.keys() - set(names))
            if unknown:
                raise ValueError(f"unknown {what}(s) {', '.join(unknown)}; accepted: {', '.join(names)}")
            init(self, *args, **kwargs)

        cls.__init__ = __init__
        return cls
    return wrap


def to_device(data, dtype, device):
    """Host data (lists or a numpy array) as a tensor on device. The copy is non-blocking: a
    blocking host-to-device copy waits for the GPU's queue, which would serialize the step's host work."""
    return torch.as_tensor(data, dtype=dtype).to(device, non_blocking=True)


# Young generations big enough that a schema compile's temporaries (tens of thousands of
# containers) die by reference count before a collection promotes them; at Python's default
# (700, 10, 10) they reached the old generation and set off a full collection every few
# compiles: 0.8-1.7 s pauses, 18% of a maskbench-dev run in one process.
GC_THRESHOLDS = (20_000, 10, 50)


def settle_gc() -> None:
    """For a process that has finished starting (a server, a compile worker): collect once, keep
    what startup made out of every later collection (gc.freeze: the tokenizer and model objects
    are never garbage) and set GC_THRESHOLDS."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
