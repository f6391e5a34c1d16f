"""verl's dataset and sampler factories in the entry module (``from verl.trainer.main_ppo import
create_rl_dataset, create_rl_sampler``): verl's signatures, built on the RL dataset and sampler the trainer uses."""

import inspect

import pyarrow as pa
import pyarrow.parquet as pq
from omegaconf import OmegaConf
from torch.utils.data import SequentialSampler

from verl.trainer.main_ppo import create_rl_dataset, create_rl_sampler
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.utils.embedded import load_tokenizer
from verl.utils.embedded.arithmetic import make_rl_rows


def data_config(**kw):
    base = dict(prompt_key="prompt", max_prompt_length=64, truncation="error", filter_overlong_prompts=False,
                return_raw_chat=False, return_full_prompt=False, shuffle=True, seed=None, train_max_samples=3,
                custom_cls={"path": None, "name": None}, sampler={"class_path": None, "class_name": None})
    base.update(kw)
    return OmegaConf.create(base)


def test_verls_signatures():
    assert list(inspect.signature(create_rl_dataset).parameters) == ["data_paths", "data_config", "tokenizer",
                                                                    "processor", "is_train", "max_samples"]
    assert inspect.signature(create_rl_dataset).parameters["max_samples"].default == -1
    assert list(inspect.signature(create_rl_sampler).parameters) == ["data_config", "dataset"]


def test_dataset_and_sampler(tmp_path):
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(make_rl_rows(10, split="train", seed=0)), str(path))
    tok = load_tokenizer()
    full = create_rl_dataset(str(path), data_config(), tok, None)
    assert isinstance(full, RLHFDataset) and len(full) == 10  # max_samples=-1: every row, as in verl
    assert len(create_rl_dataset([str(path)], data_config(), tok, None, max_samples=4)) == 4
    order = list(create_rl_sampler(data_config(seed=5), full))
    assert sorted(order) == list(range(10)) and order == list(create_rl_sampler(data_config(seed=5), full))
    assert isinstance(create_rl_sampler(data_config(shuffle=False), full), SequentialSampler)
