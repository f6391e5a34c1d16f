"""release_loader_workers stops a stateful loader's worker processes that stay alive after training stops
mid-epoch (the trainer calls it at the end of fit())."""

import torch

from verl.trainer.ppo.dataloader import build_dataloader, release_loader_workers


class Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return {"x": torch.tensor([i * i])}


def test_workers_of_a_half_read_loader_are_stopped():
    loader = build_dataloader(Squares(), batch_size=4, num_workers=2, drop_last=True)
    first = next(iter(loader))
    assert first["x"].shape == (4, 1)
    workers = list(getattr(loader._iterator, "_workers", []))
    assert len(workers) == 2 and all(w.is_alive() for w in workers)
    assert release_loader_workers(loader) is True
    for w in workers:
        w.join(timeout=10)
    assert not any(w.is_alive() for w in workers)
    assert release_loader_workers(loader) is False  # nothing left to stop
    assert release_loader_workers(None) is False


def test_single_process_loader_has_nothing_to_release():
    loader = build_dataloader(Squares(), batch_size=4, num_workers=0)
    next(iter(loader))
    assert release_loader_workers(loader) is False
