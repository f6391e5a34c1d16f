"""``RMDataset`` (verl's dataset of chosen/rejected pairs for reward-model training): importable, not supported
yet; building one raises NotImplementedError naming the capability."""

from torch.utils.data import Dataset

from verl.utils.unsupported import unsupported_class

__all__ = ["RMDataset"]

RMDataset = unsupported_class("RMDataset", "reward-model training on preference pairs", None,
                              "RLHFDataset for RL prompts, SFTDataset for supervised pairs", bases=(Dataset,),
                              module=__name__)
