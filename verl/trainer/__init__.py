"""Trainers: the PPO driver (``verl.trainer.ppo``), the Hydra entry points and the SFT trainer."""
