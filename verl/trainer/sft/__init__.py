"""Pieces of the SFT recipe (``verl.trainer.fsdp_sft_trainer``): config checks, loss, HF export."""
