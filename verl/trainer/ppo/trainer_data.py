"""The PPO trainer's data side: the training and validation loaders built from ``data.*``, and the step count the
workers' LR schedules need (``RayPPOTrainer`` mixes this in)."""

from __future__ import annotations

from verl.trainer.ppo.dataloader import build_dataloader
from verl.utils.dataset.rl_dataset import collate_fn as default_collate
from verl.utils.dataset.rl_dataset import create_rl_dataset, create_rl_sampler

__all__ = ["TrainerDataMixin"]


class TrainerDataMixin:
    """Builds ``train_dataloader`` / ``val_dataloader`` and sets ``total_training_steps``. Expects ``config``,
    ``tokenizer``, ``processor``, ``device_name`` and ``use_critic`` on the trainer."""

    def _create_dataloader(self, train_dataset, val_dataset, collate_fn, train_sampler) -> None:
        data_cfg = self.config.data  # as given: a custom dataset class may read keys of its own
        typed = self.typed_config.data
        if train_dataset is None or val_dataset is None or collate_fn is None:
            if train_dataset is None:
                train_dataset = create_rl_dataset(data_cfg.train_files, data_cfg, self.tokenizer, self.processor)
            if val_dataset is None:
                val_dataset = create_rl_dataset(data_cfg.val_files, data_cfg, self.tokenizer, self.processor,
                                                is_train=False)
            if train_sampler is None:
                train_sampler = create_rl_sampler(data_cfg, train_dataset)
            collate_fn = collate_fn or default_collate
        self.train_dataset, self.val_dataset = train_dataset, val_dataset
        seed = 1 if typed.seed is None else int(typed.seed)
        # on CPU, loader processes would only compete with the workers for the same cores
        num_workers = 0 if self.device_name == "cpu" else int(typed.dataloader_num_workers or 0)
        loader_bsz, loader_bsz_key = self._loader_batch()
        self.train_dataloader = build_dataloader(
            train_dataset, loader_bsz, sampler=train_sampler, collate_fn=collate_fn,
            num_workers=num_workers, drop_last=True, shuffle=bool(typed.shuffle), seed=seed,
        )
        val_bsz = typed.val_batch_size or len(val_dataset)
        self.val_dataloader = build_dataloader(
            val_dataset, int(val_bsz), collate_fn=collate_fn, num_workers=num_workers, drop_last=False,
            shuffle=bool(typed.validation_shuffle), seed=seed,
        )
        if len(self.train_dataloader) < 1:
            raise ValueError(f"the train set has {len(train_dataset)} rows, fewer than {loader_bsz_key}="
                             f"{loader_bsz}: no full batch")
        print(f"Size of train dataloader: {len(self.train_dataloader)}, val dataloader: {len(self.val_dataloader)}")

        trainer = self.typed_config.trainer
        total = len(self.train_dataloader) * int(trainer.total_epochs)
        if trainer.total_training_steps is not None:
            total = int(trainer.total_training_steps)
        self.total_training_steps = total  # the workers' LR schedules get it in their typed sections
        print(f"Total training steps: {self.total_training_steps}")

    def _loader_batch(self) -> tuple[int, str]:
        """(prompts per training-loader batch, the key that sets it). A recipe that draws more prompts than it
        trains on per step (DAPO's dynamic sampling: ``data.gen_batch_size``) overrides this."""
        return int(self.typed_config.data.train_batch_size), "data.train_batch_size"

