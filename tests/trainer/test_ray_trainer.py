"""RayPPOTrainer's driver logic with in-process fake worker groups (no Ray, fast).

The fakes follow the worker contract (docs/dev/contracts.md): generate_sequences expands n samples per prompt
and returns prompts/responses/input_ids/attention_mask/position_ids/rollout_log_probs; compute_log_prob returns
old_log_probs + entropys; updates return meta_info["metrics"]; checkpoints are files.
"""

import json
import os

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

from verl.protocol import DataProto
from verl.trainer.ppo.checkpoint import LATEST_FILE, find_latest_ckpt_path, mark_latest, prune_checkpoints
from verl.trainer.ppo.dataloader import ResumableDataLoader
from verl.trainer.ppo.ray_trainer import RayPPOTrainer, ResourcePoolManager, Role, _val_metric_names, compute_response_mask
from verl.trainer.ppo.utils import rollout_probs_diff_metrics

CONFIG_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "verl", "trainer", "config")
P, R = 6, 5


# ------------------------------------------------------------------------------------------------ fakes
class FakeTokenizer:
    eos_token_id = 2
    pad_token_id = 0

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(int(i)) for i in ids if int(i) != 0)


def make_rows(n):
    rows = []
    for i in range(n):
        length = 2 + i % 4
        ids = torch.zeros(P, dtype=torch.long)
        ids[P - length:] = torch.arange(3, 3 + length)
        ids[-1] = 10 + i  # every prompt distinct (validation groups samples by prompt text)
        mask = (ids != 0).long()
        rows.append({"input_ids": ids, "attention_mask": mask, "position_ids": torch.clamp(mask.cumsum(0) - 1, min=0),
                     "raw_prompt_ids": ids[P - length:].tolist(), "data_source": "toy", "index": i,
                     "reward_model": {"ground_truth": str(i % 3)}})
    return rows


def collate(rows):
    out = {k: torch.stack([r[k] for r in rows]) for k in ("input_ids", "attention_mask", "position_ids")}
    for k in ("raw_prompt_ids", "data_source", "index", "reward_model"):
        arr = np.empty(len(rows), dtype=object)
        arr[:] = [r[k] for r in rows]
        out[k] = arr
    return out


class FakeWG:
    def __init__(self, world_size=2, n=1, log=None):
        self.world_size, self.n, self.calls, self.log = world_size, n, [], log if log is not None else []
        self.version = 0
        self.gen = torch.Generator().manual_seed(0)

    def _check_divisible(self, data):
        assert len(data) % self.world_size == 0, f"{len(data)} rows for {self.world_size} ranks"

    def generate_sequences(self, prompts):
        self._check_divisible(prompts)
        self.calls.append(("gen", len(prompts), dict(prompts.meta_info)))
        n = 1 if prompts.meta_info.get("validate") else self.n
        idx = prompts.batch["input_ids"].repeat_interleave(n, 0)
        attn = prompts.batch["attention_mask"].repeat_interleave(n, 0)
        resp = torch.randint(3, 9, (idx.size(0), R), generator=self.gen)
        lengths = torch.randint(1, R + 1, (idx.size(0),), generator=self.gen)
        rmask = (torch.arange(R)[None, :] < lengths[:, None]).long()
        resp = resp * rmask
        full_mask = torch.cat([attn, rmask], -1)
        logp = -torch.rand(idx.size(0), R, generator=self.gen) * rmask
        return DataProto.from_dict(tensors={
            "prompts": idx, "responses": resp, "input_ids": torch.cat([idx, resp], -1), "attention_mask": full_mask,
            "position_ids": torch.clamp(full_mask.cumsum(-1) - 1, min=0), "rollout_log_probs": logp,
        }, meta_info={"timing": {"generate_sequences": 0.01}})

    def compute_log_prob(self, data):
        self._check_divisible(data)
        self.calls.append(("old", len(data)))
        return DataProto.from_dict(tensors={"old_log_probs": data.batch["rollout_log_probs"] + 1e-6,
                                            "entropys": torch.ones_like(data.batch["rollout_log_probs"])})

    def compute_ref_log_prob(self, data):
        self.calls.append(("ref", len(data)))
        return DataProto.from_dict(tensors={"ref_log_prob": data.batch["old_log_probs"] - 0.1})

    def compute_values(self, data):
        self.calls.append(("values", len(data)))
        return DataProto.from_dict(tensors={"values": torch.zeros_like(data.batch["responses"], dtype=torch.float)})

    def update_actor(self, data):
        self.calls.append(("update_actor", len(data)))
        assert {"advantages", "old_log_probs", "response_mask"} <= set(data.batch.keys())
        self.version += 1
        return DataProto(meta_info={"metrics": {"actor/pg_loss": [float(data.batch["advantages"].sum())],
                                                "actor/ppo_kl": [0.0]}})

    def update_critic(self, data):
        self.calls.append(("update_critic", len(data)))
        assert "returns" in data.batch.keys()
        return DataProto(meta_info={"metrics": {"critic/vf_loss": [1.0, 3.0]}})

    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        os.makedirs(local_path, exist_ok=True)
        with open(os.path.join(local_path, "state.json"), "w") as f:
            json.dump({"version": self.version, "gen": self.gen.get_state().tolist()}, f)

    def load_checkpoint(self, local_path, hdfs_path=None, del_local_after_load=False):
        with open(os.path.join(local_path, "state.json")) as f:
            state = json.load(f)
        self.version = state["version"]
        self.gen.set_state(torch.tensor(state["gen"], dtype=torch.uint8))
        self.calls.append(("load", local_path))


def reward_fn(data, return_dict=False):
    scores = torch.zeros_like(data.batch["responses"], dtype=torch.float)
    lengths = data.batch["attention_mask"][:, -R:].sum(-1)
    for i, length in enumerate(lengths.tolist()):
        scores[i, max(length, 1) - 1] = float(data.batch["responses"][i, 0] % 2)
    if return_dict:
        return {"reward_tensor": scores, "reward_extra_info": {"acc": scores.sum(-1).tolist()}}
    return scores


def make_config(tmp_path, *overrides):
    with initialize_config_dir(config_dir=os.path.abspath(CONFIG_DIR), version_base=None):
        return compose(config_name="ppo_trainer", overrides=[
            "actor_rollout_ref.rollout.name=hf", "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "trainer.logger=[file]", "trainer.total_epochs=2", "trainer.val_before_train=True", "trainer.test_freq=2",
            f"trainer.default_local_dir={tmp_path / 'ckpt'}", "trainer.n_gpus_per_node=2", *overrides])


def make_trainer(cfg, n=1):
    mapping = {Role.ActorRollout: object, Role.Critic: object}
    if cfg.actor_rollout_ref.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward:
        mapping[Role.RefPolicy] = object
    pools = ResourcePoolManager(resource_pool_spec={"global_pool": [2]}, mapping={r: "global_pool" for r in mapping})
    trainer = RayPPOTrainer(cfg, FakeTokenizer(), mapping, pools, reward_fn=reward_fn, val_reward_fn=reward_fn,
                            train_dataset=make_rows(12), val_dataset=make_rows(6), collate_fn=collate,
                            device_name="cpu")
    wg = FakeWG(n=n)
    trainer.actor_rollout_wg = wg
    trainer.critic_wg = wg if trainer.use_critic else None
    trainer.ref_policy_wg = wg if trainer.use_reference_policy else None
    return trainer, wg


def read_jsonl(path):
    return [json.loads(line) for line in open(path)]


# ------------------------------------------------------------------------------------------------ tests
def test_fit_gae_steps_metrics_checkpoints(tmp_path, monkeypatch):
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "m.jsonl"))
    cfg = make_config(tmp_path, "trainer.save_freq=2", "algorithm.use_kl_in_reward=True",
                      "trainer.max_actor_ckpt_to_keep=1", "trainer.max_critic_ckpt_to_keep=1")
    trainer, wg = make_trainer(cfg)
    assert trainer.total_training_steps == 6  # 12 rows / 4 per batch x 2 epochs
    trainer.fit()
    records = read_jsonl(tmp_path / "m.jsonl")
    steps = [r["step"] for r in records]
    assert steps == [0, 1, 2, 3, 4, 5, 6]
    step2 = records[2]["data"]
    for key in ("actor/pg_loss", "critic/vf_loss", "actor/entropy", "actor/reward_kl_penalty", "critic/score/mean",
                "training/rollout_probs_diff_max", "timing_s/gen", "timing_s/generate_sequences", "perf/throughput",
                "val-core/toy/acc/mean@1", "global_seqlen/mean"):
        assert key in step2, key
    assert step2["critic/vf_loss"] == 2.0  # reduce_metrics: the mean over micro-batches
    assert step2["training/epoch"] == 0 and records[4]["data"]["training/epoch"] == 1
    assert step2["training/rollout_probs_diff_max"] < 1e-5
    # the order of calls in one step follows the algorithm
    kinds = [c[0] for c in wg.calls if c[0] != "gen" or not c[2].get("validate")]
    first = kinds[:7]
    assert first == ["gen", "old", "ref", "values", "update_critic", "update_actor", "gen"]
    root = tmp_path / "ckpt"
    assert (root / LATEST_FILE).read_text() == "6"
    # retention: only the newest actor/critic checkpoint is kept
    assert sorted(p for p in os.listdir(root) if p.startswith("global_step_")) == ["global_step_6"]
    assert (root / "training_curves.png").exists()


def test_critic_warmup_and_grpo_without_critic(tmp_path, monkeypatch):
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "m.jsonl"))
    cfg = make_config(tmp_path, "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4",
                      "actor_rollout_ref.actor.use_kl_loss=True", "trainer.total_training_steps=2",
                      "trainer.val_before_train=False")
    trainer, wg = make_trainer(cfg, n=4)
    assert not trainer.use_critic and trainer.use_reference_policy
    trainer.fit()
    gens = [c for c in wg.calls if c[0] == "gen" and not c[2].get("validate")]
    assert [g[1] for g in gens] == [4, 4]  # prompts are sent once; the rollout makes n=4 samples each
    assert [c[1] for c in wg.calls if c[0] == "update_actor"] == [16, 16]
    assert "values" not in [c[0] for c in wg.calls]

    cfg = make_config(tmp_path / "w", "trainer.critic_warmup=2", "trainer.total_training_steps=3",
                      "trainer.val_before_train=False")
    trainer, wg = make_trainer(cfg)
    trainer.fit()
    # verl: the actor updates once critic_warmup <= global_step, i.e. at steps 2 and 3
    assert [c[0] for c in wg.calls].count("update_actor") == 2
    assert [c[0] for c in wg.calls].count("update_critic") == 3


def test_resume_continues_with_identical_metrics(tmp_path, monkeypatch):
    def run(tag, *extra):
        monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / f"{tag}.jsonl"))
        cfg = make_config(tmp_path / tag, "trainer.val_before_train=False", "trainer.save_freq=1", "trainer.test_freq=-1",
                          *extra)
        trainer, wg = make_trainer(cfg)
        trainer.fit()
        return {r["step"]: r["data"] for r in read_jsonl(tmp_path / f"{tag}.jsonl")}, wg

    full, _ = run("full")
    assert sorted(full) == [1, 2, 3, 4, 5, 6]
    part, _ = run("part", "trainer.total_training_steps=3")  # "killed" after step 3's checkpoint
    assert sorted(part) == [1, 2, 3]
    # resume into the same directory: starts at step 4 (epoch 1, across the epoch boundary)
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "resumed.jsonl"))
    cfg = make_config(tmp_path / "part", "trainer.val_before_train=False", "trainer.save_freq=1", "trainer.test_freq=-1")
    trainer, wg = make_trainer(cfg)
    trainer.fit()
    assert ("load", str(tmp_path / "part" / "ckpt" / "global_step_3" / "actor")) in wg.calls
    resumed = {r["step"]: r["data"] for r in read_jsonl(tmp_path / "resumed.jsonl")}
    assert sorted(resumed) == [4, 5, 6]
    for step in (4, 5, 6):
        a = {k: v for k, v in full[step].items() if not k.startswith(("timing", "perf/"))}
        b = {k: v for k, v in resumed[step].items() if not k.startswith(("timing", "perf/"))}
        assert a == b, step

    # resume_mode=disable starts over; resume_path picks a given step
    cfg = make_config(tmp_path / "part", "trainer.resume_mode=resume_path",
                      f"trainer.resume_from_path={tmp_path / 'part' / 'ckpt' / 'global_step_2'}")
    trainer, wg = make_trainer(cfg)
    assert trainer._load_checkpoint() == 2


def test_validation_pads_to_world_size_and_names_metrics(tmp_path):
    cfg = make_config(tmp_path, "data.val_batch_size=3", "actor_rollout_ref.rollout.val_kwargs.n=2")
    trainer, wg = make_trainer(cfg)
    metrics = trainer._validate()
    val_gens = [c for c in wg.calls if c[0] == "gen"]
    assert all(c[1] % 2 == 0 and c[2]["validate"] and c[2]["do_sample"] is False for c in val_gens)
    assert "val-core/toy/acc/mean@2" in metrics and "val-aux/toy/reward/mean@2" in metrics


def test_helpers():
    data = DataProto.from_dict(tensors={"responses": torch.zeros(2, 3), "attention_mask": torch.tensor(
        [[1, 1, 1, 1, 0], [0, 1, 1, 0, 0]])})
    assert compute_response_mask(data).tolist() == [[1, 1, 0], [1, 0, 0]]
    m = rollout_probs_diff_metrics(torch.log(torch.tensor([[0.5, 0.2]])), torch.log(torch.tensor([[0.4, 0.9]])),
                                   torch.tensor([[1, 0]]))
    assert m["training/rollout_probs_diff_max"] == pytest.approx(0.1)
    names = _val_metric_names({"s": {"reward": {"mean@4": 1.0, "best@4/mean": 2.0, "best@2/mean": 3.0, "std@4": 0.1}}})
    assert names == {"val-core/s/reward/mean@4": 1.0, "val-core/s/reward/best@4/mean": 2.0,
                     "val-aux/s/reward/best@2/mean": 3.0, "val-aux/s/reward/std@4": 0.1}


def test_checkpoint_marker_and_pruning(tmp_path):
    root = str(tmp_path)
    assert find_latest_ckpt_path(root) is None
    for step in (1, 2, 3):
        for sub in ("actor", "critic"):
            os.makedirs(os.path.join(root, f"global_step_{step}", sub))
        mark_latest(root, step)
    assert find_latest_ckpt_path(root) == os.path.join(root, "global_step_3")
    assert not [f for f in os.listdir(root) if f.startswith(".tmp")]  # atomic write leaves no temp file
    prune_checkpoints(root, max_actor=2, max_critic=1)
    assert not os.path.exists(os.path.join(root, "global_step_1"))
    assert os.path.isdir(os.path.join(root, "global_step_2", "actor"))
    assert not os.path.exists(os.path.join(root, "global_step_2", "critic"))


def test_resumable_dataloader_mid_epoch():
    data = list(range(10))
    loader = ResumableDataLoader(data, 3, shuffle=True, seed=5, collate_fn=list)
    full = [b for _ in range(2) for b in loader]
    loader2 = ResumableDataLoader(data, 3, shuffle=True, seed=5, collate_fn=list)
    it = iter(loader2)
    seen = [next(it), next(it)]
    state = loader2.state_dict()
    loader3 = ResumableDataLoader(data, 3, shuffle=True, seed=5, collate_fn=list)
    loader3.load_state_dict(state)
    rest = list(loader3) + list(loader3)
    assert seen + rest == full


def test_val_only_and_sample_dumps(tmp_path, monkeypatch):
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "m.jsonl"))
    cfg = make_config(tmp_path, "trainer.val_only=True", f"trainer.validation_data_dir={tmp_path / 'val'}")
    trainer, wg = make_trainer(cfg)
    trainer.fit()
    assert [r["step"] for r in read_jsonl(tmp_path / "m.jsonl")] == [0]
    assert not [c for c in wg.calls if c[0] == "update_actor"]
    rows = read_jsonl(tmp_path / "val" / "0.jsonl")
    assert len(rows) == 6 and {"input", "output", "score", "step"} <= set(rows[0])

    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "m2.jsonl"))
    cfg = make_config(tmp_path / "r", "trainer.val_before_train=False", "trainer.total_training_steps=1",
                      f"trainer.rollout_data_dir={tmp_path / 'rollouts'}", "trainer.log_val_generations=2",
                      "actor_rollout_ref.rollout.n=2", "algorithm.adv_estimator=grpo")
    trainer, wg = make_trainer(cfg, n=2)
    trainer.fit()
    rows = read_jsonl(tmp_path / "rollouts" / "1.jsonl")
    assert len(rows) == 8 and len({r["uid"] for r in rows}) == 4  # 4 prompts x 2 samples, grouped by uid
