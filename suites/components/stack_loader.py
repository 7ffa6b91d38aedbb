"""The loader the `dataset` component built, read as a training loop reads it: a torch DataLoader,
torchdata's StatefulDataLoader, any iterable (`iter()` once per epoch, again when one ends) or an
iterator that is its own (the reference ShardedLoader). Its position is the loader's own: the suites
keep no count of their own that a checkpointer could lean on, so a load that misplaces it shows."""

from __future__ import annotations

import copy

from ..state.device_copies import on_device


class StackLoader:
    """The stack's loader and the iterator a run is reading it through; `batches_ahead` reads on
    without moving the run, through a copy or else the loader's own state (see its docstring)."""

    def __init__(self, loader):
        self.loader = loader
        self.iterator = loader if is_own_iterator(loader) else None
        self.pending: list = []  # batches a look-ahead read from a loader without state, to be read again

    def next_batch(self):
        """The next batch; the next epoch's first where this one has ended."""
        if self.pending:
            return self.pending.pop(0)
        if self.iterator is None:
            self.iterator = iter(self.loader)
        try:
            return next(self.iterator)
        except StopIteration:
            if self.iterator is self.loader:
                raise RuntimeError(f"the loader ({type(self.loader).__name__}) ran out of batches") from None
        self.iterator = iter(self.loader)
        try:
            return next(self.iterator)
        except StopIteration:
            raise RuntimeError(f"the loader ({type(self.loader).__name__}) yields no batch in an epoch") from None

    def reopen(self) -> None:
        """After a checkpointer's load: read on from a fresh `iter(loader)`, which starts where the
        loader's `load_state_dict` put it (StatefulDataLoader keeps a loaded state for its next iterator)."""
        self.pending = []
        if self.iterator is not self.loader:
            self.iterator = None

    def batches_ahead(self, count: int, dataset=None) -> list:
        """The `count` batches the run reads next, on the CPU, leaving its position where it is.

        Read from a copy of the loader and its iterator (`dataset` shared, not copied) where they copy,
        so even state the loader's state dict leaves out (an epoch counter) stays put; else read from
        the loader and put back through its own state (`state_dict`, then `load_state_dict` and a
        fresh iterator: torch's DataLoader iterators refuse to be copied); a loader without state has
        no position a checkpoint could keep, and what was read is read again by the run."""
        try:
            loader, iterator = copy.deepcopy((self.loader, self.iterator), {id(dataset): dataset})
        except Exception:
            pass
        else:
            ahead = StackLoader(loader)
            ahead.iterator, ahead.pending = iterator, list(self.pending)
            return [on_device(ahead.next_batch(), "cpu") for _ in range(count)]
        if has_state(self.loader):
            position = copy.deepcopy(self.loader.state_dict())
            batches = [on_device(self.next_batch(), "cpu") for _ in range(count)]
            self.loader.load_state_dict(position)
            self.reopen()
            return batches
        read = [self.next_batch() for _ in range(count)]
        self.pending = read + self.pending
        return [on_device(batch, "cpu") for batch in read]


def is_own_iterator(loader) -> bool:
    """Whether `loader` is read with `next()` itself (an iterator), not through `iter(loader)`."""
    return hasattr(loader, "__next__") and (not hasattr(loader, "__iter__") or iter(loader) is loader)


def has_state(loader) -> bool:
    """Whether `loader` keeps its position in a state dict of its own."""
    return callable(getattr(loader, "state_dict", None)) and callable(getattr(loader, "load_state_dict", None))
