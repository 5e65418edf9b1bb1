"""PyTorch's allocator on every device, and XLA on TPU: the OOM is read, its numbers too, and a
fragmentation fix names the device's own allocator variable (or none where there is none).

Wordings from the source: c10/cuda/CUDACachingAllocator.cpp (hipified to 'HIP out of memory' and
PYTORCH_HIP_ALLOC_CONF on ROCm), c10/xpu/XPUCachingAllocator.cpp, torch_npu's
NPUCachingAllocator.cpp (the torch 2.0 layout with 'current active'), XLA/PJRT's RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import pytest
from builders import write_bundle
from test_accelerators import VENDORS, vendor_node, vendor_pod

from bot.diagnosis.diagnose import diagnose
from bot.diagnosis.evidence import load_bundle
from bot.diagnosis.logfacts import extract
from bot.diagnosis.models import LogText
from bot.diagnosis.playbooks import load_playbooks

HIP = ("torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.25 GiB. GPU 0 has a total capacity of 63.98 GiB "
       "of which 812.00 MiB is free. Of the allocated memory 50.10 GiB is allocated by PyTorch, and 12.30 GiB is reserved "
       "by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
       "PYTORCH_HIP_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")
XPU = ("torch.OutOfMemoryError: XPU out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total capacity of 48.00 GiB "
       "of which 100.00 MiB is free. Of the allocated memory 40.50 GiB is allocated by PyTorch, and 6.25 GiB is reserved "
       "by PyTorch but unallocated.")
NPU = ("RuntimeError: NPU out of memory. Tried to allocate 1.50 GiB (NPU 0; 60.97 GiB total capacity; 48.00 GiB already "
       "allocated; 48.00 GiB current active; 300.00 MiB free; 58.20 GiB reserved in total by PyTorch)")
TPU_BUFFER = ("RuntimeError: RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to allocate 3.00G. That was not "
              "possible. There are 1.25G free.; (0x0x0_HBM0)")
TPU_HBM = ("jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory "
           "space hbm. Used 17.10G of 15.75G hbm. Exceeded hbm capacity by 1.35G.")


@pytest.mark.parametrize(("text", "numbers"), [
    (HIP, {"oom_tried_gib": 2.25, "oom_total_gib": 63.98, "oom_reserved_unallocated_gib": 12.30}),
    (XPU, {"oom_tried_gib": 0.5, "oom_total_gib": 48.0, "oom_reserved_unallocated_gib": 6.25}),
    (NPU, {"oom_tried_gib": 1.5, "oom_total_gib": 60.97, "oom_reserved_gib": 58.20}),
    (TPU_BUFFER, {"oom_tried_gib": 3.0, "oom_free_gib": 1.25}),
    (TPU_HBM, {"oom_total_gib": 15.75}),
])
def test_every_devices_oom_is_read_with_its_numbers(text: str, numbers: dict[str, float]) -> None:
    facts = extract(LogText(text=text + "\n"))
    assert facts.get("oom") is True
    for name, value in numbers.items():
        assert facts.get(name) == pytest.approx(value, abs=0.01), name


def _fragmented(total: str, tried: str = "1.00 GiB", unalloc: str = "9.00 GiB", used: str = "50.00 GiB") -> str:
    # fragmentation outside the weights: the KV-cache tensors of V1's allocate step
    return ('  File "/usr/lib/python3/dist-packages/vllm/v1/worker/gpu_model_runner.py", line 10, in _allocate_kv_cache_tensors\n'
            f"torch.OutOfMemoryError: {{dev}} out of memory. Tried to allocate {tried}. GPU 0 has a total capacity of {total} "
            f"of which 200.00 MiB is free. Of the allocated memory {used} is allocated by PyTorch, and {unalloc} is reserved "
            "by PyTorch but unallocated.\n")


@pytest.mark.parametrize(("vendor", "device_word", "env"), [
    ("nvidia", "CUDA", "PYTORCH_CUDA_ALLOC_CONF"),
    ("amd", "HIP", "PYTORCH_HIP_ALLOC_CONF"),
    ("ascend", "NPU", "PYTORCH_NPU_ALLOC_CONF"),
])
def test_fragmentation_sets_the_devices_own_allocator_variable(tmp_path, vendor, device_word, env) -> None:
    resource, labels = VENDORS[vendor]
    log = _fragmented("63.98 GiB").replace("{dev}", device_word)
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, vendor_pod(resource), vendor_node(resource, labels, 1))))
    assert result.cause == "allocator-fragmentation"
    assert [(c.kind, c.name, c.after) for c in result.changes] == [("env", env, "expandable_segments:True")]
    book = next(b for b in load_playbooks() if b.id == result.cause)
    assert all(book.allows(c) for c in result.changes)


@pytest.mark.parametrize("vendor", ["intel", "tpu"])
def test_no_allocator_variable_where_the_device_has_none(tmp_path, vendor) -> None:
    resource, labels = VENDORS[vendor]
    log = _fragmented("63.98 GiB").replace("{dev}", "XPU")
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, vendor_pod(resource), vendor_node(resource, labels, 1))))
    assert not [c for c in result.changes if c.kind == "env" and "CUDA" in c.name]


def test_hip_hint_in_the_log_names_the_variable_whatever_the_pod_says(tmp_path) -> None:
    # a ROCm image on a pod whose limits name no device (a device plugin with its own resource name)
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", HIP + "\n", vendor_pod("memory"), None)))
    assert [c.name for c in result.changes if c.kind == "env"] in ([], ["PYTORCH_HIP_ALLOC_CONF"])
    assert not [c for c in result.changes if c.kind == "env" and c.name == "PYTORCH_CUDA_ALLOC_CONF"]


def test_cached_remainder_far_above_the_request_is_not_the_weights(tmp_path) -> None:
    # online fp8 quantization on an NVIDIA card: OOM in process_weights_after_loading, 7 GiB cached beside 62 GiB in use
    log = ('  File "/usr/lib/python3/dist-packages/vllm/model_executor/layers/quantization/fp8.py", line 400, in '
           "process_weights_after_loading\n"
           "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 896.00 MiB. GPU 0 has a total capacity of "
           "79.19 GiB of which 300.00 MiB is free. Including non-PyTorch memory, this process has 78.88 GiB memory in use. "
           "Of the allocated memory 70.40 GiB is allocated by PyTorch, and 7.10 GiB is reserved by PyTorch but "
           "unallocated.\n")
    resource, labels = VENDORS["nvidia"]
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, vendor_pod(resource), vendor_node(resource, labels, 1))))
    assert result.cause == "allocator-fragmentation"
    assert not [c for c in result.changes if c.name == "--cpu-offload-gb"]


@pytest.mark.parametrize("devices", [1, 4, 8])
def test_tpu_hbm_exhausted_while_loading_fits_the_tpu_pod(tmp_path, devices) -> None:
    resource, labels = VENDORS["tpu"]
    log = ('  File "/usr/local/lib/python3.11/site-packages/vllm/v1/worker/tpu_model_runner.py", line 1210, in load_model\n'
           + TPU_BUFFER + "\n")
    bundle = write_bundle(tmp_path / "b", log, vendor_pod(resource, 1), vendor_node(resource, labels, devices))
    result = diagnose(load_bundle(bundle))
    assert result.cause == "weights-exceed-gpu"
    for change in result.changes:
        assert "nvidia" not in change.name and "CUDA" not in change.name
        if change.kind == "resources":
            assert change.name == f"limits.{resource}" and int(change.after or 0) <= devices
        if change.name == "--tensor-parallel-size":
            assert int(change.after or 0) <= devices


def _npu_kv_oom(tried: str, allocated: str, free: str, reserved: str) -> str:
    # torch_npu's layout, raised while vllm-ascend allocates the KV-cache tensors it sized
    return ('  File "/vllm-workspace/vllm-ascend/vllm_ascend/worker/model_runner_v1.py", line 10, in initialize_kv_cache\n'
            f"RuntimeError: NPU out of memory. Tried to allocate {tried} (NPU 0; 61.00 GiB total capacity; {allocated} already "
            f"allocated; {allocated} current active; {free} free; {reserved} reserved in total by PyTorch) If reserved "
            "memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.\n")


def _ascend_pod_at(utilization: str) -> dict:
    resource, _ = VENDORS["ascend"]
    pod = vendor_pod(resource, 4)
    pod["spec"]["containers"][0]["args"] += ["--tensor-parallel-size", "4", "--gpu-memory-utilization", utilization]
    return pod


def test_npu_past_its_utilization_budget_lowers_utilization_not_the_allocator(tmp_path) -> None:
    # 0.8 x 61 = 48.8 GiB budget, yet PyTorch holds 52 GiB and asks 1.5 more: a cached remainder of 6.5 GiB covers
    # the request, but the plan itself went past the budget (vllm-ascend#3368, #8289): the threads lowered utilization;
    # no other process holds the rest (61 - 1.4 free - 58.5 reserved = 1.1 GiB)
    resource, labels = VENDORS["ascend"]
    log = _npu_kv_oom("1.50 GiB", "52.00 GiB", "1.40 GiB", "58.50 GiB")
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, _ascend_pod_at("0.8"), vendor_node(resource, labels, 4))))
    assert result.cause == "shared-gpu-free-memory"
    change = next(c for c in result.changes if c.name == "--gpu-memory-utilization")
    # 52 + 1.5 - 48.8 = 4.7 GiB past the budget, 1 GiB margin: 0.8 - 5.7 / 61 = 0.7066
    assert change.after == "0.70"
    assert not [c for c in result.changes if c.kind == "env"]


def test_npu_within_its_budget_with_a_split_cache_is_still_fragmentation(tmp_path) -> None:
    # 0.95 x 61 = 57.95 GiB budget; 44 GiB held, 1.5 asked, 15.5 GiB cached but unallocated: the room was there, split
    resource, labels = VENDORS["ascend"]
    log = _npu_kv_oom("1.50 GiB", "44.00 GiB", "1.00 GiB", "59.50 GiB")
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, _ascend_pod_at("0.95"), vendor_node(resource, labels, 4))))
    assert result.cause == "allocator-fragmentation"
    assert [(c.kind, c.name) for c in result.changes] == [("env", "PYTORCH_NPU_ALLOC_CONF")]


def test_npu_past_its_budget_in_the_profile_run_is_not_read_as_the_kv_plan(tmp_path) -> None:
    # the same overrun raised from the dummy forward pass: that is the profile run's peak, not the KV plan
    resource, labels = VENDORS["ascend"]
    log = _npu_kv_oom("1.50 GiB", "52.00 GiB", "1.40 GiB", "58.50 GiB").replace(
        "initialize_kv_cache", "profile_run")
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, _ascend_pod_at("0.8"), vendor_node(resource, labels, 4))))
    assert result.cause != "shared-gpu-free-memory"
