"""create_rl_sampler + a stateful dataloader: a saved state resumes mid-epoch and across epochs."""

import pytest
import torch
from omegaconf import OmegaConf
from torch.utils.data import Dataset, SequentialSampler

from verl.utils.dataset import dataloader as dl
from verl.utils.dataset.rl_dataset import create_rl_sampler


class Numbers(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": torch.tensor(i)}


def collate(items):
    return {"x": torch.stack([it["x"] for it in items])}


def flat(batches):
    return [i for b in batches for i in b["x"].tolist()]


def make_loader(seed=1, shuffle=True, n=10, batch_size=3):
    cfg = OmegaConf.create({"shuffle": shuffle, "seed": seed, "sampler": {"class_path": None, "class_name": None}})
    ds = Numbers(n)
    return dl.create_stateful_dataloader(
        ds, batch_size=batch_size, sampler=create_rl_sampler(cfg, ds), collate_fn=collate
    )


def run_epochs(loader, epochs):
    return [flat(list(loader)) for _ in range(epochs)]


@pytest.fixture(params=["torchdata", "fallback"])
def backend(request, monkeypatch):
    if request.param == "torchdata":
        if not dl.torchdata_available():
            pytest.skip("torchdata not installed")
    else:
        monkeypatch.setattr(dl, "torchdata_available", lambda: False)
    return request.param


def test_seeded_order_matches_torch_random_sampler(backend):
    epochs = run_epochs(make_loader(seed=5), 2)
    g = torch.Generator().manual_seed(5)
    expected = [torch.randperm(10, generator=g).tolist()[:9] for _ in range(2)]  # drop_last: 3 batches of 3
    assert epochs == expected
    assert run_epochs(make_loader(seed=5), 2) == epochs
    assert run_epochs(make_loader(seed=6), 1) != epochs[:1]
    assert run_epochs(make_loader(shuffle=False), 1) == [list(range(9))]


@pytest.mark.parametrize("stop_epoch, stop_batch", [(0, 1), (1, 2), (1, 0)])
def test_resume_mid_epoch(backend, stop_epoch, stop_batch):
    reference = run_epochs(make_loader(seed=2), 3)
    loader = make_loader(seed=2)
    seen = []
    for epoch in range(stop_epoch + 1):
        it = iter(loader)
        for _ in range(3 if epoch < stop_epoch else stop_batch):
            seen += next(it)["x"].tolist()
    state = loader.state_dict()
    del it

    fresh = make_loader(seed=2)
    fresh.load_state_dict(state)
    rest = flat(list(fresh))  # finishes the interrupted epoch
    rest += [i for e in run_epochs(fresh, 2 - stop_epoch) for i in e]
    assert seen + rest == [i for e in reference for i in e]


def test_sequential_resume(backend):
    loader = make_loader(shuffle=False)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    fresh = make_loader(shuffle=False)
    fresh.load_state_dict(state)
    assert flat(list(fresh)) == [3, 4, 5, 6, 7, 8]
    if backend == "torchdata":
        assert isinstance(create_rl_sampler(OmegaConf.create({"shuffle": False}), Numbers(3)), SequentialSampler)


def test_custom_sampler_class(tmp_path):
    path = tmp_path / "my_sampler.py"
    path.write_text(
        "from torch.utils.data import Sampler\n"
        "class Backwards(Sampler):\n"
        "    def __init__(self, data_source, data_config):\n"
        "        self.n = len(data_source)\n"
        "    def __iter__(self):\n"
        "        return iter(range(self.n - 1, -1, -1))\n"
        "    def __len__(self):\n"
        "        return self.n\n"
    )
    cfg = OmegaConf.create({"shuffle": True, "sampler": {"class_path": str(path), "class_name": "Backwards"}})
    assert list(create_rl_sampler(cfg, Numbers(4))) == [3, 2, 1, 0]
    cfg.sampler.class_name = "Nope"
    with pytest.raises(AttributeError, match="'Nope' is not defined"):
        create_rl_sampler(cfg, Numbers(4))
