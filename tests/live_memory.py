"""Bytes of live tensor storage, counted op by op: what stage 03's memory plan predicts, unblurred by
allocators.

Resident memory (RSS) adds what the C allocator keeps or returns, which differs from machine to machine (a
plan checked against RSS passed at 0.93 on one machine and failed at 0.81 on another). This counter sees every
tensor an operator returns (a TorchDispatchMode), remembers each storage once through a weak reference (a
storage dies with its last tensor, and the weak reference says so), and follows storages resized in place
(FSDP2 frees and re-allocates gathered weights with UntypedStorage.resize_, which no operator sees). Tensors
that exist before it starts are counted once registered with `add`. Kernels' own scratch buffers never reach
Python and are not counted: the plan does not count them either. The count depends only on the operators run,
not on the machine, the allocator or the thread count.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


def storages(t: torch.Tensor) -> list[torch.UntypedStorage]:
    """The storages behind a tensor, through wrapper subclasses (DTensor) down to their local tensors."""
    if hasattr(t, "__tensor_flatten__"):
        inner = (getattr(t, name) for name in t.__tensor_flatten__()[0])
        return [s for x in inner if isinstance(x, torch.Tensor) for s in storages(x)]
    return [t.untyped_storage()]


class LiveTensorBytes(TorchDispatchMode):
    """Live and peak bytes of the storages seen since it was entered (and of those registered with `add`)."""

    def __init__(self):
        super().__init__()
        self.sizes: dict[int, list] = {}  # id(storage) -> [weak reference, bytes counted]
        self.live = self.peak = 0

    def add(self, t: torch.Tensor) -> None:
        for st in storages(t):
            self._count(st)

    def _count(self, st: torch.UntypedStorage) -> None:
        key, nbytes = id(st), st.nbytes()
        if key not in self.sizes:  # the callback runs when the storage dies, before its id can be reused
            self.sizes[key] = [weakref.ref(st, lambda _, k=key: self._free(k)), 0]
        self.live += nbytes - self.sizes[key][1]
        self.sizes[key][1] = nbytes
        self.peak = max(self.peak, self.live)

    def _free(self, key: int) -> None:
        self.live -= self.sizes.pop(key)[1]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.add(t)
        return out

    def __enter__(self):
        resize, tracker = torch.UntypedStorage.resize_, self

        def counted_resize(st, size):
            resize(st, size)
            tracker._count(st)

        self._resize, torch.UntypedStorage.resize_ = resize, counted_resize
        return super().__enter__()

    def __exit__(self, *exc):
        torch.UntypedStorage.resize_ = self._resize
        return super().__exit__(*exc)
