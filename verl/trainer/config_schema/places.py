"""Where honoured keys are read: the ``read_in`` values of the schema (a module, or a package ending in ``/``).

``tests/trainer/test_config_key_status.py`` checks that every honoured key's name appears in one of them, so a
key whose reader moves or disappears shows up as a failing test rather than as a key that silently does nothing.
"""

WORKERS = "verl/workers/"  # the training engine and role workers (actor, critic, reference, reward model)
ENGINE = "verl/workers/engine/"  # the training engine (FSDP) behind every trainer
MEGATRON = "verl/models/mcore/settings.py"  # the megatron.* keys the Megatron engine reads (and checks)
ROLLOUT = "verl/workers/rollout/"
SHARDING = "verl/workers/sharding_manager/"  # the hybrid-engine weight push
VLLM = "verl/workers/rollout/vllm_rollout/vllm_rollout.py"
SGLANG = "verl/workers/rollout/sglang_rollout/sglang_rollout.py"
FSDP = "verl/utils/fsdp_utils.py"
BATCH_SIZES = "verl/utils/batch_sizes.py"  # per-rank batch sizes (driver checks and workers)
CKPT = "verl/utils/checkpoint/"
MODEL = "verl/utils/model.py"
TRAINER = "verl/trainer/ppo/ray_trainer.py"
TRAINER_DATA = "verl/trainer/ppo/trainer_data.py"  # the trainer's data loaders and step count
WORKER_GROUPS = "verl/trainer/ppo/worker_groups.py"  # the trainer's worker groups (spawn, register)
VALIDATION = "verl/trainer/ppo/validation.py"
CHECKPOINTING = "verl/trainer/ppo/checkpoint.py"  # the trainer's save/resume (CheckpointMixin)
LOSS = "verl/trainer/ppo/policy_loss.py"
KL = "verl/trainer/ppo/kl.py"
ADV = "verl/trainer/ppo/advantage.py"
PF_PPO = "verl/trainer/ppo/pf_ppo.py"
ROLLOUT_CORR = "verl/trainer/ppo/rollout_corr.py"
REWARD = "verl/trainer/ppo/reward.py"
DAPO = "recipe/dapo/dapo_ray_trainer.py"  # DAPO's dynamic sampling (data.gen_batch_size, algorithm.filter_groups)
MAIN = "verl/trainer/main_ppo.py"  # the driver: config checks, Ray start
RECIPE = "verl/trainer/recipe_driver.py"  # the recipe drivers' base (data order, loop, checkpoints)
RUNNER = "verl/trainer/task_runner.py"  # the TaskRunner: tokenizer, datasets, worker classes, pools
SCHEMA = "verl/trainer/config_schema/validate.py"
RL_DATA = "verl/utils/dataset/rl_dataset.py"
TRACKING = "verl/utils/tracking.py"
PROFILER = "verl/utils/profiler/"  # the workers' DistProfiler (per-role profiler.* keys)
PROFILING = "verl/trainer/ppo/profiling.py"  # which steps the trainer profiles (global_profiler.*)
PROFILER_CHECKS = "verl/trainer/config_schema/profiler.py"  # tools refused before Ray starts
SFT = "verl/trainer/fsdp_sft_trainer.py"
SFT_CHECKS = "verl/trainer/sft/config.py"
SFT_DATA = "verl/utils/dataset/sft_dataset.py"
SFT_MULTITURN = "verl/utils/dataset/multiturn_sft_dataset.py"
SFT_ENGINE = "verl/trainer/sft_trainer.py"  # verl 0.7's engine layout of SFT (sft_trainer_engine.yaml)
