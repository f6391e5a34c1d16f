"""Building the reward function the PPO trainer calls: custom scorer loading and reward-manager selection.

Config keys (verl's): ``custom_reward_function.{path, name, reward_kwargs}``, ``reward_model.reward_manager``,
``reward_manager.{source, name, module.path, module.name}``, ``reward_model.reward_kwargs``, ``data.reward_fn_key``,
``reward_model.num_workers`` (the reward function scores in that many Ray actors at once: :class:`RewardLoop`).
They are read from the config's typed view (the schema's frozen classes: a key the config leaves out has the
schema's default); ``config`` may be the Hydra config or that typed view already built.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import os
import re
import sys
from collections.abc import Mapping
from typing import Any, Callable

import ray
import torch
from omegaconf import DictConfig, OmegaConf

from verl.trainer.config_schema.ppo import PPOTrainerConfig, as_ppo_config
from verl.utils.reward_score import default_compute_score
from verl.workers.reward_manager import get_reward_manager_cls

__all__ = ["CustomRewardFunction", "get_custom_reward_fn", "load_reward_manager", "compute_reward", "compute_reward_async",
           "load_extern_object", "RewardLoop", "RewardLoopWorker"]


def _to_dict(node: Any) -> dict:
    """A free-form mapping of the config (user kwargs) as a plain dict; null is empty."""
    if node is None:
        return {}
    if isinstance(node, DictConfig):
        return OmegaConf.to_container(node, resolve=True)
    return dict(node)


def load_extern_object(path: str, name: str, config_key: str) -> Any:
    """``name`` from the Python file at ``path`` (imported by path, registered in ``sys.modules``)."""
    full = os.path.abspath(os.path.expanduser(str(path)))
    if not os.path.isfile(full):
        raise FileNotFoundError(f"{config_key}.path: file '{path}' not found (resolved to '{full}'). "
                                f"Point {config_key}.path at an existing .py file.")
    module_name = "verl_custom_" + re.sub(r"\W", "_", os.path.splitext(os.path.basename(full))[0])
    spec = importlib.util.spec_from_file_location(module_name, full)
    if spec is None or spec.loader is None:
        raise ImportError(f"{config_key}.path: cannot import '{full}' as a Python module (is it a .py file?)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # lets pickle find classes/functions defined in the file
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(module_name, None)
        raise RuntimeError(f"{config_key}.path: error while importing '{full}': {type(e).__name__}: {e}") from e
    if not hasattr(module, name):
        defined = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_")
                         and getattr(v, "__module__", None) == module_name)
        raise AttributeError(f"{config_key}: '{name}' not found in '{full}'. Callables defined there: "
                             f"{defined or 'none'}. Set {config_key}.name=<one of them>.")
    return getattr(module, name)


class CustomRewardFunction:
    """A scoring function loaded from a file, with ``reward_kwargs`` bound.

    Pickles as (path, name, kwargs) and re-imports the file on the other side, so the reward manager holding
    it can be shipped to Ray tasks or spawned worker processes where the file was never imported.
    """

    def __init__(self, path: str, name: str, reward_kwargs: dict | None = None) -> None:
        self.path, self.name, self.reward_kwargs = path, name, dict(reward_kwargs or {})
        fn = load_extern_object(path, name, "custom_reward_function")
        if not callable(fn):
            raise TypeError(f"custom_reward_function: '{name}' in '{path}' is a {type(fn).__name__}, not a function")
        self._fn = fn
        functools.update_wrapper(self, fn)

    def __call__(self, *args, **kwargs):
        return self._fn(*args, **{**self.reward_kwargs, **kwargs})

    def __reduce__(self):
        return (CustomRewardFunction, (self.path, self.name, self.reward_kwargs))

    def __repr__(self) -> str:
        return f"CustomRewardFunction({self.path!r}, {self.name!r}, reward_kwargs={self.reward_kwargs})"


def get_custom_reward_fn(config) -> Callable | None:
    """The user's scoring function from ``custom_reward_function.path`` / ``.name`` (default
    ``compute_score``), with ``custom_reward_function.reward_kwargs`` bound; None when no path is set."""
    custom = as_ppo_config(config).custom_reward_function
    if not custom.path:
        return None
    fn = CustomRewardFunction(str(custom.path), str(custom.name), _to_dict(custom.reward_kwargs))
    print(f"using customized reward function '{custom.name}' from '{custom.path}'")
    return fn


def _reward_manager_name(typed: PPOTrainerConfig) -> str:
    explicit = typed.reward_manager.name
    legacy = typed.reward_model.reward_manager
    if explicit and legacy and explicit != legacy:
        # reward_manager.name follows reward_model.reward_manager by default; a plain default 'naive' in one
        # of them means the other was set on purpose.
        if explicit == "naive":
            return legacy
        if legacy == "naive":
            return explicit
        raise ValueError(f"reward_manager.name={explicit!r} and reward_model.reward_manager={legacy!r} disagree; "
                         "set only one of them")
    return explicit or legacy


def load_reward_manager(config, tokenizer, num_examine: int, **reward_kwargs):
    """Instantiate the configured reward manager with the custom scorer (or ``default_compute_score``).

    ``config``: the Hydra config, or its typed view (:class:`~verl.trainer.config_schema.ppo.PPOTrainerConfig`).
    ``reward_kwargs`` (usually ``config.reward_model.reward_kwargs``, which is also read here as a default)
    go to the manager's constructor, e.g. ``max_resp_len`` / ``overlong_buffer_cfg`` for ``dapo`` or
    ``num_processes`` / ``timeout`` for ``prime``.
    """
    typed = as_ppo_config(config)
    reward_model, manager = typed.reward_model, typed.reward_manager
    compute_score = get_custom_reward_fn(typed) or default_compute_score
    sandbox = reward_model.sandbox_fusion
    if sandbox.url and compute_score is default_compute_score:
        # code data sources (codecontests, apps, codeforces, taco) run their programs on that server
        compute_score = functools.partial(default_compute_score, sandbox_fusion_url=str(sandbox.url),
                                          memory_limit_mb=int(sandbox.memory_limit_mb),
                                          max_concurrent=int(sandbox.max_concurrent))

    if manager.source == "register":
        manager_cls = get_reward_manager_cls(_reward_manager_name(typed))
    elif manager.source == "importlib":
        if not manager.module.path:
            raise ValueError("reward_manager.source=importlib needs reward_manager.module.path=<file.py> "
                             "(and reward_manager.module.name=<class>)")
        manager_cls = load_extern_object(manager.module.path, manager.module.name, "reward_manager.module")
    else:
        raise ValueError(f"reward_manager.source must be 'register' or 'importlib', got {manager.source!r}")

    kwargs = {**_to_dict(reward_model.reward_kwargs), **reward_kwargs}
    params = inspect.signature(manager_cls.__init__).parameters
    if "overlong_buffer_cfg" in params and "overlong_buffer_cfg" not in kwargs:
        if reward_model.overlong_buffer is not None:  # recipe/dapo's spelling
            kwargs["overlong_buffer_cfg"] = _to_dict(reward_model.overlong_buffer)
    if "max_resp_len" in params and kwargs.get("max_resp_len") is None:
        kwargs["max_resp_len"] = int(typed.data.max_response_length)

    return manager_cls(tokenizer=tokenizer, num_examine=num_examine, compute_score=compute_score,
                       reward_fn_key=typed.data.reward_fn_key, **kwargs)


def _accepts_return_dict(reward_fn: Callable) -> bool:
    try:
        params = inspect.signature(reward_fn).parameters
    except (TypeError, ValueError):
        return True
    return "return_dict" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def compute_reward(data, reward_fn: Callable) -> tuple[Any, dict[str, list]]:
    """``(reward_tensor, reward_extra_infos_dict)`` for a batch; works with managers and with plain
    ``reward_fn(data) -> tensor`` callables."""
    if _accepts_return_dict(reward_fn):
        result = reward_fn(data, return_dict=True)
    else:
        result = reward_fn(data)
    if isinstance(result, Mapping):
        return result["reward_tensor"], dict(result.get("reward_extra_info") or {})
    return result, {}


# num_cpus=0: the worker pools reserve (nearly) every CPU on a small machine, and a task asking for one
# would never be scheduled; scoring is light, or runs in its own processes (prime).
@ray.remote(num_cpus=0)
def compute_reward_async(data, config=None, tokenizer=None, reward_fn=None):
    """Ray task version of :func:`compute_reward` (``reward_model.launch_reward_fn_async=True``): overlaps
    scoring with the log-prob computation. Builds the manager from ``config`` when ``reward_fn`` is None."""
    if reward_fn is None:
        if config is None or tokenizer is None:
            raise ValueError("compute_reward_async needs reward_fn, or config and tokenizer to build one")
        reward_fn = load_reward_manager(config, tokenizer, num_examine=0)
    return compute_reward(data, reward_fn)


@ray.remote(num_cpus=0)
class RewardLoopWorker:
    """One of ``reward_model.num_workers`` Ray actors that score rows with the reward function (kept in the actor
    from its start, so it is sent once)."""

    def __init__(self, reward_fn: Callable):
        self.reward_fn = reward_fn

    def score(self, data) -> tuple[Any, dict[str, list]]:
        return compute_reward(data, self.reward_fn)


class RewardLoop:
    """``reward_model.num_workers > 1``: the reward function scores a batch in that many Ray actors at once, each
    taking a contiguous slice of the rows; the scores and extra infos come back in row order, the same as one
    call of the function on the whole batch. Worth it when scoring is slow (sandboxed code, a remote judge).

    A callable with the reward managers' signature, so it stands wherever a reward function does."""

    def __init__(self, reward_fn: Callable, num_workers: int):
        if num_workers < 1:
            raise ValueError(f"reward_model.num_workers={num_workers} must be >= 1")
        self.num_workers = int(num_workers)
        self.workers = [RewardLoopWorker.remote(reward_fn) for _ in range(self.num_workers)]

    def __call__(self, data, return_dict: bool = False):
        n = len(data)
        bounds = [n * i // self.num_workers for i in range(self.num_workers + 1)]
        parts = [(lo, hi) for lo, hi in zip(bounds, bounds[1:]) if hi > lo]
        results = ray.get([w.score.remote(data.slice(lo, hi)) for w, (lo, hi) in zip(self.workers, parts)])
        tensor = torch.cat([r[0] for r in results], dim=0)
        extra: dict[str, list] = {}
        for k in {k for _, infos in results for k in infos}:
            if all(k in infos for _, infos in results):  # a key only some slices report would misalign rows
                extra[k] = [v for _, infos in results for v in infos[k]]
        if return_dict:
            return {"reward_tensor": tensor, "reward_extra_info": extra}
        return tensor
