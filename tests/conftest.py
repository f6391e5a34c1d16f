import os

import pytest

# Offline, local-only, quiet defaults for every test process (and the Ray workers they start).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "offline")


@pytest.fixture(scope="session")
def tiny_vlm_dir(tmp_path_factory):
    """A tiny Qwen2-VL directory (random weights, tokenizer with vision tokens, image processor), built once."""
    # imported here so that collecting tests which do not use it does not load transformers
    from verl.utils.embedded.vlm import make_vlm_model_dir

    return make_vlm_model_dir(str(tmp_path_factory.mktemp("vlm") / "vlm-tiny"), seed=0)


# ------------------------------------------------------------------------------- one Ray for the e2e runs
# Every end-to-end test runs the trainer as its user would (a driver process that calls ray.init). Starting and
# stopping a private Ray instance costs each of those runs about 10 s on a 2-core machine, so they join one Ray
# head started once for the session instead (RAY_ADDRESS, the way a user joins a cluster). Tests that start Ray
# nodes of their own, call ray.init in the test process or check the local-start path are marked `own_ray`.
# VERL_TEST_OWN_RAY=1 gives every run its own Ray again.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def shared_ray_address(tmp_path_factory):
    from ray_nodes import kill_sessions, start_local_head

    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0",
               PYTHONPATH=os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p))
    # what a trainer-started local Ray sets (verl.trainer.host_defaults.RAY_ENV), so the workers behave the same
    from verl.trainer.host_defaults import RAY_ENV

    for name, (_, ours, _) in RAY_ENV.items():
        env.setdefault(name, str(ours))
    address, sids = start_local_head(env, tmp_path_factory.mktemp("ray_head") / "head.log", num_cpus=8)
    try:
        yield address
    finally:
        kill_sessions(sids, grace=5.0)


@pytest.fixture(autouse=True)
def _e2e_runs_join_the_shared_ray(request):
    if (request.node.get_closest_marker("e2e") is None or request.node.get_closest_marker("own_ray") is not None
            or os.environ.get("VERL_TEST_OWN_RAY") == "1"):
        yield
        return
    mp = pytest.MonkeyPatch()
    mp.setenv("RAY_ADDRESS", request.getfixturevalue("shared_ray_address"))
    try:
        yield
    finally:
        mp.undo()
