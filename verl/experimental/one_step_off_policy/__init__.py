"""One-step-off-policy PPO/GRPO: rollout on its own processes generates batch k+1 while the actor trains on
batch k; the actor's new weights reach the rollout processes after every update (see ``ray_trainer.py``).

Entry point: ``python -m verl.experimental.one_step_off_policy.main_ppo key=value ...``.
"""
