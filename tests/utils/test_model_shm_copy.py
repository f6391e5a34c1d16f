"""``model.use_shm=True`` (verl's key): every role loads its weights from one copy of the model directory in
/dev/shm, made once per machine. The copy is renamed into place, so concurrent processes never read a half-copied
model and leave nothing behind."""

import os
import shutil
import threading
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from verl.utils.fs import SHM_CACHE, copy_to_local, md5_encode
from verl.workers.engine.config import actor_engine_config, critic_engine_config

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm (Linux shared memory)")
CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "verl" / "trainer" / "config")


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "qwen2"}')
    (d / "model.safetensors").write_bytes(os.urandom(1 << 16))
    yield d
    for entry in Path(SHM_CACHE).glob(_dst_name(d) + "*"):
        shutil.rmtree(entry, ignore_errors=True)


def _dst_name(d: Path) -> str:
    return md5_encode(os.path.abspath(d))


def _leftovers(d: Path) -> list[str]:
    return [p.name for p in Path(SHM_CACHE).glob(_dst_name(d) + ".tmp-*")]


def test_copied_once_and_renamed_into_place(model_dir):
    assert copy_to_local(str(model_dir)) == str(model_dir)  # without use_shm: the path itself
    dst = copy_to_local(str(model_dir), use_shm=True)
    assert dst == os.path.join(SHM_CACHE, _dst_name(model_dir)) and dst != str(model_dir)
    assert (Path(dst) / "model.safetensors").read_bytes() == (model_dir / "model.safetensors").read_bytes()
    stamp = os.stat(Path(dst) / "model.safetensors").st_mtime_ns
    assert copy_to_local(str(model_dir), use_shm=True) == dst  # second call: no new copy
    assert os.stat(Path(dst) / "model.safetensors").st_mtime_ns == stamp
    assert _leftovers(model_dir) == []


def test_concurrent_copies_agree_and_leave_nothing_behind(model_dir):
    results, errors = [], []

    def copy():
        try:
            results.append(copy_to_local(str(model_dir), use_shm=True))
        except Exception as e:  # noqa: BLE001 - collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=copy) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(set(results)) == 1
    assert sorted(os.listdir(results[0])) == ["config.json", "model.safetensors"]
    assert _leftovers(model_dir) == []


def test_roles_load_from_the_shm_copy_when_use_shm_is_set(model_dir):
    overrides = [f"actor_rollout_ref.model.path={model_dir}", f"critic.model.path={model_dir}"]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        plain = compose("ppo_trainer", overrides=overrides)
        shm = compose("ppo_trainer", overrides=overrides + ["actor_rollout_ref.model.use_shm=true",
                                                            "critic.model.use_shm=true"])
    OmegaConf.resolve(plain)
    OmegaConf.resolve(shm)
    assert actor_engine_config(plain.actor_rollout_ref).model_path == str(model_dir)
    assert actor_engine_config(shm.actor_rollout_ref).model_path.startswith(SHM_CACHE + "/")
    assert critic_engine_config(shm.critic).model_path == actor_engine_config(shm.actor_rollout_ref).model_path
