"""Data loaders whose position can be saved in a checkpoint and restored exactly.

``build_dataloader`` returns the dataset package's stateful loader (torchdata's ``StatefulDataLoader`` when
installed, as in verl); for samplers it cannot drive, ``ResumableDataLoader``: a single-process loader over a (batch) sampler that records where the
current epoch started (the sampler generator's state) and how many batches it has handed out, so that
``load_state_dict`` continues with the very next batch of the same permutation.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

from verl.utils.dataset.dataloader import create_stateful_dataloader, make_random_sampler, make_sequential_sampler

__all__ = ["ResumableDataLoader", "build_dataloader"]


class ResumableDataLoader:
    def __init__(self, dataset, batch_size: int, sampler=None, collate_fn: Callable | None = None,
                 drop_last: bool = True, shuffle: bool = False, seed: int = 1):
        self.dataset = dataset
        self.batch_size = int(batch_size)
        if sampler is None:
            if shuffle:
                generator = torch.Generator()
                generator.manual_seed(seed)
                sampler = RandomSampler(dataset, generator=generator)
            else:
                sampler = SequentialSampler(dataset)
        self.sampler = sampler
        self.batch_sampler = BatchSampler(sampler, self.batch_size, drop_last)
        self.collate_fn = collate_fn or (lambda rows: rows)
        self._epoch = 0
        self._yielded = 0
        self._epoch_start_rng = None
        self._pending: dict | None = None

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def _generator(self):
        return getattr(self.sampler, "generator", None)

    def __iter__(self):
        gen = self._generator()
        skip = 0
        if self._pending is not None:
            state, self._pending = self._pending, None
            if gen is not None and state.get("epoch_start_rng") is not None:
                gen.set_state(state["epoch_start_rng"])
            skip = int(state.get("yielded", 0))
        self._epoch_start_rng = gen.get_state().clone() if gen is not None else None
        self._yielded = skip
        for i, indices in enumerate(self.batch_sampler):
            if i < skip:
                continue
            self._yielded = i + 1
            yield self.collate_fn([self.dataset[j] for j in indices])
        self._epoch += 1
        self._yielded = 0
        self._epoch_start_rng = None

    def state_dict(self) -> dict[str, Any]:
        gen = self._generator()
        start = self._epoch_start_rng
        if start is None and gen is not None:  # between epochs: the next epoch starts from the current state
            start = gen.get_state().clone()
        state = {"epoch": self._epoch, "yielded": self._yielded, "epoch_start_rng": start}
        if hasattr(self.sampler, "state_dict"):
            state["sampler"] = self.sampler.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._epoch = int(state.get("epoch", 0))
        if "sampler" in state and hasattr(self.sampler, "load_state_dict"):
            self.sampler.load_state_dict(state["sampler"])
        self._pending = dict(state)


def build_dataloader(dataset, batch_size: int, sampler=None, collate_fn=None, num_workers: int = 0,
                     drop_last: bool = True, shuffle: bool = False, seed: int = 1):
    """A resumable loader: the dataset package's stateful loader (torchdata's ``StatefulDataLoader`` or its
    resumable samplers) when it can drive ``sampler``, else ``ResumableDataLoader`` above."""
    if sampler is None:
        sampler = make_random_sampler(dataset, seed=seed) if shuffle else make_sequential_sampler(dataset)
    try:
        return create_stateful_dataloader(dataset, batch_size, sampler, collate_fn, num_workers=num_workers,
                                          drop_last=drop_last)
    except TypeError:  # a custom sampler the resumable loader cannot drive
        pass
    return ResumableDataLoader(dataset, batch_size, sampler=sampler, collate_fn=collate_fn, drop_last=drop_last,
                               shuffle=shuffle, seed=seed)


def release_loader_workers(loader) -> bool:
    """Stop a multi-process loader's worker processes now; returns whether there were any.

    A resumable (stateful) loader keeps its current iterator -- and with it the worker processes -- alive so that
    ``state_dict()`` can read it, until the loader itself is freed. When training stops mid-epoch inside a Ray
    actor, those workers would only die with the actor, and each death prints a "DataLoader worker ... killed"
    traceback after a run that finished fine (seen on a GPU machine, where ``dataloader_num_workers`` > 0).
    """
    iterator = getattr(loader, "_iterator", None)
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if not callable(shutdown) or not getattr(iterator, "_workers", None) or getattr(iterator, "_shutdown", False):
        return False
    shutdown()
    return True
