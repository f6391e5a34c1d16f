"""verl.utils.config.cfg_get: the one reader for config values, on every kind of node the code passes around."""

import dataclasses
import types

import omegaconf
import pytest
from omegaconf import OmegaConf

from verl.utils.config import cfg_get


@dataclasses.dataclass
class _Inner:
    lr: float = 1e-6
    betas: tuple = (0.9, 0.999)
    eps: float | None = None


@dataclasses.dataclass
class _Outer:
    optim: _Inner = dataclasses.field(default_factory=_Inner)
    name: str = "actor"


def _struct(node: dict):
    cfg = OmegaConf.create(node)
    OmegaConf.set_struct(cfg, True)
    return cfg


@pytest.mark.parametrize("make", [dict, OmegaConf.create, _struct], ids=["dict", "DictConfig", "struct"])
def test_mappings_plain_and_dotted_keys(make):
    cfg = make({"optim": {"lr": 3e-4, "eps": None}, "n": 0, "flag": False})
    assert cfg_get(cfg, "optim.lr") == 3e-4
    assert cfg_get(cfg, "n", 5) == 0 and cfg_get(cfg, "flag", True) is False  # falsy values are kept
    assert cfg_get(cfg, "optim.eps", 1e-8) == 1e-8  # explicit None counts as missing
    assert cfg_get(cfg, "optim.missing", "d") == "d"
    assert cfg_get(cfg, "nothing.below.here", 7) == 7
    assert cfg_get(cfg, "n.deeper", 7) == 7  # a leaf has no children


def test_dataclasses_namespaces_and_none():
    cfg = _Outer()
    assert cfg_get(cfg, "optim.lr") == 1e-6
    assert cfg_get(cfg, "optim.betas") == (0.9, 0.999)
    assert cfg_get(cfg, "optim.eps", 1e-8) == 1e-8
    assert cfg_get(cfg, "optim.unknown", "x") == "x"
    assert cfg_get(types.SimpleNamespace(a=types.SimpleNamespace(b=2)), "a.b") == 2
    assert cfg_get(None, "anything", 3) == 3
    # a dataclass inside an OmegaConf node and the other way round
    mixed = {"actor": OmegaConf.create({"optim": {"lr": 0.5}}), "ref": _Outer(name="ref")}
    assert cfg_get(mixed, "actor.optim.lr") == 0.5 and cfg_get(mixed, "ref.name") == "ref"


def test_a_missing_dictconfig_key_raises_nothing_inside_omegaconf(monkeypatch):
    """Misses are read with .get, never by catching omegaconf's exceptions (each one costs ~0.1 ms to build)."""
    raised = []
    original = omegaconf.errors.OmegaConfBaseException.__init__

    def counting_init(self, *args, **kwargs):
        raised.append(type(self).__name__)
        original(self, *args, **kwargs)

    monkeypatch.setattr(omegaconf.errors.OmegaConfBaseException, "__init__", counting_init)
    cfg = _struct({"rollout": {"n": 4}})
    for key in ("rollout.temperature", "rollout.n", "agent.num_workers", "missing"):
        cfg_get(cfg, key, None)
    assert raised == []
    # the check itself can fail: attribute access on a struct node does raise through omegaconf
    with pytest.raises(omegaconf.errors.ConfigAttributeError):
        cfg.rollout.temperature
    assert raised
