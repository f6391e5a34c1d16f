import pytest

from verl.utils import device


def test_auto_resolves_to_cpu_without_accelerators(monkeypatch):
    monkeypatch.delenv("VERL_DEVICE", raising=False)
    if device.is_cuda_available() or device.is_npu_available():
        pytest.skip("this test describes a machine without accelerators")
    assert device.resolve_device("auto") == "cpu"
    assert device.get_dist_backend() == "gloo"
    assert device.get_ray_resource_name() is None
    assert device.get_visible_devices_env() is None
    assert device.get_device(0).type == "cpu"


def test_spec_table_covers_each_backend():
    assert device._SPECS["cuda"].dist_backend == "nccl"
    assert device._SPECS["npu"].dist_backend == "hccl"
    assert device._SPECS["npu"].visible_devices_env == "ASCEND_RT_VISIBLE_DEVICES"
    assert device._SPECS["cuda"].ray_resource == "GPU"


def test_bad_device_names_the_key():
    with pytest.raises(ValueError, match="trainer.device='tpu'"):
        device.resolve_device("tpu")


def test_requesting_missing_cuda_is_a_clear_error():
    if device.is_cuda_available():
        pytest.skip("needs a machine without CUDA")
    with pytest.raises(ValueError, match="no CUDA GPU"):
        device.resolve_device("cuda")


def test_cpu_device_module_rng_roundtrip():
    mod = device._CpuDeviceModule
    state = mod.get_rng_state()
    import torch

    a = torch.rand(3)
    mod.set_rng_state(state)
    assert torch.equal(a, torch.rand(3))
