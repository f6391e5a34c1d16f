"""Fixtures shared by the recipe end-to-end tests."""

import pytest


@pytest.fixture(scope="session")
def arith_rl_assets(tmp_path_factory):
    """The untrained tiny model (seed 0) and one-digit arithmetic prompts in verl's RL schema: 32 training and
    16 held-out rows (paths by name: ``model``, ``train``, ``test``)."""
    from verl.utils.dataset.preprocess_utils import write_parquet
    from verl.utils.embedded import make_model_dir
    from verl.utils.embedded.arithmetic import ArithmeticConfig, make_rl_rows

    root = tmp_path_factory.mktemp("arith_rl")
    cfg = ArithmeticConfig(max_digits=1)
    return {"model": make_model_dir(str(root / "model"), size="tiny", seed=0),
            "train": write_parquet(make_rl_rows(32, "train", seed=0, config=cfg), str(root / "train.parquet")),
            "test": write_parquet(make_rl_rows(16, "test", seed=1, config=cfg), str(root / "test.parquet"))}


@pytest.fixture(scope="session")
def arith_pref_files(tmp_path_factory):
    """Embedded one-digit arithmetic preferences: 16 training and 8 held-out expressions, as pairs (``train``,
    ``test``) and unpaired for KTO (``kto_train``, ``kto_test``), plus ``sft_train``."""
    from verl.utils.embedded.arithmetic import ArithmeticConfig
    from verl.utils.embedded.preferences import write_preference_files

    root = tmp_path_factory.mktemp("arith_pref")
    return write_preference_files(str(root), n_train=16, n_test=8, config=ArithmeticConfig(max_digits=1))


@pytest.fixture
def env(monkeypatch):
    """The environment a recipe driver runs with in these tests (offline, no Ray auth, Ray workers at normal
    priority); Ray is shut down after the test if the driver left it running."""
    for key, value in {"HF_HUB_OFFLINE": "1", "RAY_AUTH_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false",
                       "WANDB_MODE": "offline", "RAY_DEDUP_LOGS": "0", "RAY_worker_niceness": "0"}.items():
        monkeypatch.setenv(key, value)
    yield
    import ray

    if ray.is_initialized():
        ray.shutdown()
