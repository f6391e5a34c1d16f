"""Small Ray helpers for local (single machine) runs.

``init_local_ray`` starts a private Ray instance that listens on the loopback interface only, with
the dashboard, token auth and usage stats off: the setting every test, example and laptop run wants.
Given ``address=`` (or with ``RAY_ADDRESS`` set) it joins that cluster instead and leaves every
networking and auth setting to Ray and the cluster.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Mapping

import ray

try:  # a private Ray module: a Ray release without it keeps its own node-address choice (see _force_loopback)
    from ray._private import ray_constants as _ray_constants
except ImportError:
    _ray_constants = None

_LOCAL_ENV_DEFAULTS = {
    # Ray 2.60 turns on token auth and writes a token under $HOME; a private local instance needs neither.
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
}


def joins_existing_cluster(address: str | None = None, environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``ray.init(address=address)`` would connect to a running cluster rather than start a new
    local instance: an explicit address other than ``"local"``, or no address and ``RAY_ADDRESS`` set
    (Ray reads it then)."""
    if address is None:
        address = (os.environ if environ is None else environ).get("RAY_ADDRESS") or None
    return address is not None and address != "local"


def init_local_ray(num_cpus: int | None = None, **kwargs: Any):
    """Start (or reuse) a loopback-only Ray instance and return ``ray.init``'s context.

    Args:
        num_cpus: logical CPUs Ray may hand out; ``None`` lets Ray count the machine's cores.
        **kwargs: passed to ``ray.init``. ``include_dashboard`` defaults to False,
            ``_node_ip_address`` to ``127.0.0.1``; ``runtime_env`` and the rest pass through.

    The environment defaults (``RAY_AUTH_MODE=disabled``, no usage stats) are only set when the
    caller has not set them, so an explicit choice in the shell wins.

    With ``address=...`` (other than ``"local"``) or ``RAY_ADDRESS`` set, none of these local defaults is
    applied: Ray joins the existing cluster with its own settings (pass ``num_cpus=None`` then; a
    running cluster's resources are fixed).
    """
    if ray.is_initialized():
        return None
    kwargs.setdefault("ignore_reinit_error", True)
    if joins_existing_cluster(kwargs.get("address")):
        return ray.init(num_cpus=num_cpus, **kwargs)
    for key, value in _LOCAL_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    kwargs.setdefault("include_dashboard", False)
    kwargs.setdefault("_node_ip_address", "127.0.0.1")
    if kwargs["_node_ip_address"] in ("127.0.0.1", "localhost"):
        _force_loopback()
    return ray.init(num_cpus=num_cpus, **kwargs)


def _force_loopback() -> None:
    """Make Ray keep 127.0.0.1 as the node address.

    Ray replaces a loopback ``_node_ip_address`` by the machine's routable IP unless its "no cluster"
    mode is on (the macOS/Windows default). That mode is read from ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``
    when Ray is imported, so set the variable (for Ray's child processes) and the already-imported
    constant (for this process).
    """
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    if os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] != "0":
        return  # the user asked for cluster mode explicitly
    if _ray_constants is not None and hasattr(_ray_constants, "ENABLE_RAY_CLUSTER"):
        _ray_constants.ENABLE_RAY_CLUSTER = False


def parallel_put(data_list: list[Any], max_workers: int | None = None) -> list["ray.ObjectRef"]:
    """``ray.put`` every item of ``data_list`` using a thread pool; refs come back in input order.

    Serialising many large objects one by one is the slow part of handing a batch to workers;
    threads overlap the copies into the object store (pickling releases the GIL for tensors).
    """
    if not data_list:
        return []
    if max_workers is None:
        max_workers = min(len(data_list), 16)
    if max_workers < 1:
        raise ValueError(f"parallel_put: max_workers={max_workers} must be >= 1")
    with ThreadPoolExecutor(max_workers=max_workers) as pool:
        return list(pool.map(ray.put, data_list))
