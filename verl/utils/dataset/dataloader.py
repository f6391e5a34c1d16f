"""Samplers and a dataloader that can resume in the middle of an epoch.

With ``torchdata`` installed (requirements.txt) this is torchdata's ``StatefulDataLoader`` with its stateful
``RandomSampler``: ``loader.state_dict()`` saved in a checkpoint and ``loader.load_state_dict(state)`` on a
fresh loader continue with the next unseen batch, also across epochs. Without torchdata the same calls work
on ``ResumableDataLoader`` with the ``Resumable*Sampler`` classes below.

Random order is ``torch.randperm(n, generator)`` per epoch with a generator seeded once, i.e. the order
``torch.utils.data.RandomSampler(generator=torch.Generator().manual_seed(seed))`` gives.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler, SequentialSampler

try:  # torchdata is in requirements.txt; without it the Resumable* classes below stand in for it
    from torchdata.stateful_dataloader import StatefulDataLoader
    from torchdata.stateful_dataloader.sampler import RandomSampler as StatefulRandomSampler
except ImportError:
    StatefulDataLoader = StatefulRandomSampler = None


def torchdata_available() -> bool:
    return StatefulDataLoader is not None


class ResumableRandomSampler(Sampler[int]):
    """A seeded random permutation per epoch whose position can be saved and restored.

    ``state_dict()`` holds the generator state at the start of the current epoch and how many indices of
    that epoch were handed out; after ``load_state_dict`` the next ``iter()`` continues right there.
    """

    def __init__(self, data_source, seed: int = 1):
        self.data_source = data_source
        self.generator = torch.Generator().manual_seed(int(seed))
        self._epoch_state: torch.Tensor | None = None
        self._yielded = 0
        self._resume_at = 0

    def __len__(self) -> int:
        return len(self.data_source)

    def __iter__(self) -> Iterator[int]:
        self._epoch_state = self.generator.get_state()
        perm = torch.randperm(len(self.data_source), generator=self.generator).tolist()
        start, self._resume_at = self._resume_at, 0
        self._yielded = start
        for index in perm[start:]:
            self._yielded += 1
            yield index
        self._epoch_state, self._yielded = None, 0  # epoch done: the next state is the next epoch's start

    def state_dict(self) -> dict[str, Any]:
        generator = self._epoch_state if self._epoch_state is not None else self.generator.get_state()
        return {"generator": generator.clone(), "yielded": self._yielded}

    def next_epoch_state(self) -> dict[str, Any]:
        """The state the next ``iter()`` starts from (call it before iterating)."""
        return {"generator": self.generator.get_state().clone(), "yielded": self._resume_at}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        self._epoch_state, self._yielded = None, 0
        self._resume_at = int(state["yielded"])
        if self._resume_at >= len(self):  # the saved epoch had finished: start the next one
            torch.randperm(len(self.data_source), generator=self.generator)
            self._resume_at = 0


class ResumableSequentialSampler(Sampler[int]):
    """Indices in order, resumable like ``ResumableRandomSampler``."""

    def __init__(self, data_source):
        self.data_source = data_source
        self._yielded = 0
        self._resume_at = 0

    def __len__(self) -> int:
        return len(self.data_source)

    def __iter__(self) -> Iterator[int]:
        start, self._resume_at = self._resume_at, 0
        self._yielded = start
        for index in range(start, len(self.data_source)):
            self._yielded += 1
            yield index
        self._yielded = 0

    def state_dict(self) -> dict[str, Any]:
        return {"yielded": self._yielded}

    def next_epoch_state(self) -> dict[str, Any]:
        return {"yielded": self._resume_at}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resume_at = int(state["yielded"]) % max(len(self), 1)


def make_random_sampler(dataset, seed: int = 1) -> Sampler[int]:
    if torchdata_available():
        return StatefulRandomSampler(dataset, generator=torch.Generator().manual_seed(int(seed)))
    return ResumableRandomSampler(dataset, seed=seed)


def make_sequential_sampler(dataset) -> Sampler[int]:
    return SequentialSampler(dataset) if torchdata_available() else ResumableSequentialSampler(dataset)


class ResumableDataLoader(DataLoader):
    """A ``DataLoader`` with ``state_dict()/load_state_dict()`` that counts *consumed* batches (batches the
    workers prefetched but the caller never received are served again), for use with the ``Resumable*Sampler``
    classes when torchdata is not installed."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not hasattr(self.sampler, "next_epoch_state"):
            raise TypeError("ResumableDataLoader needs a ResumableRandomSampler or ResumableSequentialSampler")
        self._epoch_state: dict[str, Any] | None = None
        self._consumed = 0

    def __iter__(self):
        self._epoch_state = self.sampler.next_epoch_state()
        self._consumed = self._epoch_state["yielded"]
        for batch in super().__iter__():
            self._consumed += _batch_len(batch)
            yield batch
        self._epoch_state = None

    def state_dict(self) -> dict[str, Any]:
        if self._epoch_state is None:
            return {"sampler": self.sampler.state_dict()}
        consumed = self._consumed
        if self.drop_last and self.batch_size and consumed >= len(self) * self.batch_size:
            consumed = len(self.sampler)  # every full batch was served: the epoch is over
        return {"sampler": {**self._epoch_state, "yielded": consumed}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state["sampler"])


def _batch_len(batch) -> int:
    if isinstance(batch, dict):
        batch = next(iter(batch.values()))
    return len(batch)


def create_stateful_dataloader(
    dataset, batch_size: int, sampler, collate_fn, num_workers: int = 0, drop_last: bool = True
):
    """torchdata's ``StatefulDataLoader`` when installed, else ``ResumableDataLoader``."""
    if torchdata_available():
        return StatefulDataLoader(
            dataset=dataset,
            batch_size=batch_size,
            sampler=sampler,
            num_workers=num_workers,
            collate_fn=collate_fn,
            drop_last=drop_last,
        )
    return ResumableDataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=num_workers,
        collate_fn=collate_fn,
        drop_last=drop_last,
    )
