"""The weight push's gather granularity comes from verl's keys: ``rollout.update_weights_bucket_megabytes``
(default 512) per collective, or one parameter at a time with ``rollout.layered_summon=true`` (that both give the
same tensors is tested with ``iter_full_state_dict`` in tests/utils/test_fsdp_utils.py)."""

from omegaconf import OmegaConf

from verl.workers.fsdp_workers import push_bucket_bytes


def test_bucket_size_from_the_rollout_keys():
    assert push_bucket_bytes(OmegaConf.create({})) == 512 << 20  # the schema's defaults
    assert push_bucket_bytes(OmegaConf.create({"update_weights_bucket_megabytes": 64})) == 64 << 20
    assert push_bucket_bytes(OmegaConf.create({"update_weights_bucket_megabytes": 0.5})) == 1 << 19
    assert push_bucket_bytes(OmegaConf.create({"layered_summon": True, "update_weights_bucket_megabytes": 64})) == 0
