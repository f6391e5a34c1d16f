"""Preference learning pieces shared by the recipes: losses (``losses``), pair layout and engine loss
functions (``pairs``). Datasets live in ``verl.trainer.preference.dataset``; the worker role in
``verl.workers.preference_worker``."""

from verl.trainer.preference.losses import (PAIRWISE_LOSSES, bradley_terry_loss, dpo_sigmoid_loss, generalized_jsd,
                                            hinge_loss, ipo_loss, kto_loss, kto_metrics, pairwise_loss,
                                            preference_metrics, reverse_kl, same_prompt_accuracy)
from verl.trainer.preference.pairs import (REF_KEY, BradleyTerryLoss, KTOLoss, PairwisePreferenceLoss,
                                           interleave_pairs, kto_reference_point, last_token_scores, pair_train_spec,
                                           sequence_logps, split_pairs)

__all__ = ["PAIRWISE_LOSSES", "bradley_terry_loss", "dpo_sigmoid_loss", "generalized_jsd", "hinge_loss", "ipo_loss",
           "kto_loss", "kto_metrics", "pairwise_loss", "preference_metrics", "reverse_kl", "same_prompt_accuracy",
           "REF_KEY", "BradleyTerryLoss", "KTOLoss", "PairwisePreferenceLoss", "interleave_pairs",
           "kto_reference_point", "last_token_scores", "pair_train_spec", "sequence_logps", "split_pairs"]
