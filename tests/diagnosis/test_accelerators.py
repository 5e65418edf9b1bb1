"""Accelerators as data (issue 21): every proposal uses the device resource the pod already
requests, and sharded proposals only on devices the node really has, on every vendor."""

from __future__ import annotations

from typing import Any

import pytest
from builders import make_node, make_pod, write_bundle

from bot.diagnosis.diagnose import diagnose
from bot.diagnosis.evidence import load_bundle
from bot.diagnosis.gpus import gpu_grant
from bot.diagnosis.models import AdviceKind
from bot.diagnosis.playbooks import load_playbooks

# weights that cannot fit one 80 GB device: the fix is TP over more devices, when the node has them
WEIGHTS_OOM = ('  File "/usr/lib/python3/dist-packages/vllm/model_executor/models/qwen2.py", line 300, in __init__\n'
               "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.16 GiB. GPU 0 has a total capacity "
               "of 79.33 GiB of which 500.00 MiB is free. Of the allocated memory 78.33 GiB is allocated by PyTorch, and "
               "10.00 MiB is reserved by PyTorch but unallocated.\n")

# vendor -> (the pod's resource, node labels)
VENDORS: dict[str, tuple[str, dict[str, str]]] = {
    "nvidia": ("nvidia.com/gpu", {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.memory": "81920"}),
    "amd": ("amd.com/gpu", {"amd.com/gpu.product-name": "AMD_Instinct_MI210", "amd.com/gpu.vram": "64G"}),
    "intel": ("gpu.intel.com/xe", {"gpu.intel.com/product": "Intel Data Center GPU Max 1100"}),
    "intel-i915": ("gpu.intel.com/i915", {}),
    "ascend": ("huawei.com/Ascend910", {"accelerator": "huawei-Ascend910"}),
    "tpu": ("google.com/tpu", {"cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice"}),
    "gaudi": ("habana.ai/gaudi", {}),  # Intel Gaudi's device plugin writes no product label
}


def vendor_pod(resource: str, count: int = 1) -> dict[str, Any]:
    pod = make_pod(command=["vllm", "serve"], args=["Qwen/Qwen2-72B-Instruct"])
    pod["spec"]["containers"][0]["resources"] = {"limits": {resource: str(count), "memory": "64Gi"}}
    return pod


def vendor_node(resource: str, labels: dict[str, str], devices: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-node-1", "labels": dict(labels)},
            "status": {"capacity": {resource: str(devices)},
                       "allocatable": {resource: str(devices), "memory": "251Gi"}}}


def device_changes(result) -> dict[str, str | None]:
    return {c.name: c.after for c in result.changes if c.kind == "resources" and "/" in c.name}


def tp_after(result) -> int | None:
    tp = [c.after for c in result.changes if c.kind == "flag" and c.name == "--tensor-parallel-size"]
    return int(tp[0]) if tp and tp[0] else None


@pytest.mark.parametrize("vendor", sorted(VENDORS))
@pytest.mark.parametrize("devices", [1, 4, 8])
def test_proposals_use_the_pods_resource_and_fit_the_nodes_devices(tmp_path, vendor, devices):
    resource, labels = VENDORS[vendor]
    bundle = write_bundle(tmp_path / "b", WEIGHTS_OOM, vendor_pod(resource), vendor_node(resource, labels, devices))
    result = diagnose(load_bundle(bundle))
    for name, after in device_changes(result).items():
        assert name == f"limits.{resource}", f"{vendor}: proposed {name} on a pod requesting {resource}"
        assert after is not None and int(after) <= devices
    tp = tp_after(result)
    assert tp is None or tp <= devices, f"{vendor}: TP {tp} on a node with {devices} device(s)"
    if devices == 1:
        assert tp is None
    if tp and tp > 1:  # the pod must ask for as many devices as ranks, in its own resource
        assert device_changes(result) == {f"limits.{resource}": str(tp)}
    # and the approval check accepts what was shown: the playbook allows the pod's own resource
    book = next(b for b in load_playbooks() if b.id == result.cause) if result.cause else None
    if book is not None:
        assert all(book.allows(c) for c in result.changes)


def test_multi_device_amd_node_gets_more_amd_gpus_never_nvidias(tmp_path):
    bundle = write_bundle(tmp_path / "b", WEIGHTS_OOM, vendor_pod("amd.com/gpu"),
                          vendor_node("amd.com/gpu", VENDORS["amd"][1], 4))
    result = diagnose(load_bundle(bundle))
    assert result.cause == "weights-exceed-gpu"
    assert tp_after(result) in (2, 4)
    assert set(device_changes(result)) == {"limits.amd.com/gpu"}


def test_a_gaudi_pod_is_never_sent_nvidia_gpus_nor_more_cards_than_its_node_has(tmp_path):
    # habana.ai/gaudi used to be no known device: the bot proposed TP 4 with limits.nvidia.com/gpu
    # on a one-card Gaudi node
    one = diagnose(load_bundle(write_bundle(tmp_path / "one", WEIGHTS_OOM, vendor_pod("habana.ai/gaudi"),
                                            vendor_node("habana.ai/gaudi", {}, 1))))
    assert tp_after(one) is None and not device_changes(one)
    eight = diagnose(load_bundle(write_bundle(tmp_path / "eight", WEIGHTS_OOM, vendor_pod("habana.ai/gaudi"),
                                              vendor_node("habana.ai/gaudi", {}, 8))))
    assert set(device_changes(eight)) == {"limits.habana.ai/gaudi"}
    assert tp_after(eight) is not None and tp_after(eight) <= 8


@pytest.mark.parametrize("vnpu", ["huawei.com/Ascend910-8c", "huawei.com/Ascend310P-4c.3cpu.ndvpp"])
def test_an_ascend_vnpu_pod_gets_no_nvidia_gpus_no_tensor_parallel_nor_a_whole_cards_memory(tmp_path, vnpu):
    # a vNPU (the Ascend Device Plugin's virtual instance) is a slice of one card, one per pod; it
    # used to be no known device, so a weights OOM got TP with limits.nvidia.com/gpu
    node = vendor_node(vnpu, {}, 4)
    grant = gpu_grant(vendor_pod(vnpu, 1), node)
    virtual = vnpu.rpartition("/")[2]
    assert (grant.vendor, grant.resource, grant.virtual_device) == ("ascend", vnpu, virtual)
    assert grant.product == virtual.partition("-")[0]
    assert grant.memory_gib is None  # a part of the card: the card's catalogue memory would overstate it
    assert not grant.can_tensor_parallel and "virtual NPU" in grant.describe()
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", WEIGHTS_OOM, vendor_pod(vnpu), node)))
    assert tp_after(result) is None
    assert not device_changes(result)


def test_a_whole_ascend_card_is_no_vnpu():
    grant = gpu_grant(vendor_pod("huawei.com/Ascend910", 2), vendor_node("huawei.com/Ascend910", {}, 8))
    assert grant.virtual_device is None and grant.can_tensor_parallel and grant.memory_gib == 32.0


# Qwen3-32B (61 GiB of bf16 weights, in the model catalogue) out of memory loading on one 32 GiB device
QWEN3_32B_WEIGHTS_OOM = (
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/model_executor/models/qwen3.py", line 300, in __init__\n'
    "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 250.00 MiB. GPU 0 has a total capacity of "
    "31.98 GiB of which 136.00 MiB is free. Of the allocated memory 31.61 GiB is allocated by PyTorch, and "
    "1.21 MiB is reserved by PyTorch but unallocated.\n")


@pytest.mark.parametrize("vendor", ["amd", "ascend", "gaudi"])
def test_advice_for_more_devices_names_the_pods_own_device_and_no_nvidia_machines(tmp_path, vendor):
    # advice is not approvable, but "limits.nvidia.com/gpu: 4, nodeSelector nvidia.com/gpu.count"
    # and NVIDIA instance types were what an AMD or Ascend pod was told to do
    resource, labels = VENDORS[vendor]
    pod = make_pod(command=["vllm", "serve", "Qwen/Qwen3-32B"], args=[])
    pod["spec"]["containers"][0]["resources"] = {"limits": {resource: "1", "memory": "64Gi"}}
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", QWEN3_32B_WEIGHTS_OOM, pod,
                                               vendor_node(resource, labels, 1))))
    assert result.cause == "weights-exceed-gpu" and result.changes == []
    more = next(a for a in result.advice if a.kind == AdviceKind.MORE_DEVICES)
    assert {c.name for c in more.changes} == {"--tensor-parallel-size", f"limits.{resource}"}
    assert "nvidia" not in more.text + (more.yaml or "")
    assert not [a for a in result.advice if a.kind == AdviceKind.INSTANCE_TYPE]


def test_gke_time_sharing_one_t4_gets_no_tensor_parallel(tmp_path):
    labels = {"cloud.google.com/gke-accelerator": "nvidia-tesla-t4", "cloud.google.com/gke-gpu-sharing-strategy":
              "time-sharing", "cloud.google.com/gke-max-shared-clients-per-gpu": "4"}
    node = vendor_node("nvidia.com/gpu", labels, 4)  # 4 allocatable time slices of one card
    grant = gpu_grant(vendor_pod("nvidia.com/gpu", 1), node)
    assert grant.shared and grant.replicas == 4 and grant.on_node == 1 and not grant.can_tensor_parallel
    assert grant.product == "nvidia-tesla-t4" and grant.memory_gib == 15.0  # T4 from the catalogue
    log = WEIGHTS_OOM.replace("79.33 GiB", "14.58 GiB").replace("78.33 GiB", "14.0 GiB")
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, vendor_pod("nvidia.com/gpu"), node)))
    assert tp_after(result) is None
    assert not device_changes(result)


def test_mig_slices_get_no_tensor_parallel(tmp_path):
    node = make_node("NVIDIA-A100-SXM4-80GB-MIG-3g.40gb", 40192, 2)
    node["metadata"]["labels"]["nvidia.com/mig.strategy"] = "single"
    log = WEIGHTS_OOM.replace("79.33 GiB", "39.25 GiB").replace("78.33 GiB", "38.5 GiB")
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", log, make_pod(args=["Qwen/Qwen2-72B-Instruct"]), node)))
    assert tp_after(result) is None
    assert not device_changes(result)


@pytest.mark.parametrize(("vendor", "product", "memory"), [
    ("amd", "AMD_Instinct_MI210", 64.0), ("intel", "Intel Data Center GPU Max 1100", 48.0),
    ("ascend", "huawei-Ascend910", 32.0), ("tpu", "tpu-v5-lite-podslice", 16.0)])
def test_vendor_grants_read_product_memory_and_count(vendor, product, memory):
    resource, labels = VENDORS[vendor]
    grant = gpu_grant(vendor_pod(resource, 2), vendor_node(resource, labels, 8))
    assert (grant.vendor, grant.resource, grant.granted, grant.on_node) == (vendor, resource, 2, 8)
    assert grant.product == product and grant.memory_gib == memory


def test_a_declared_device_limit_allows_the_pods_own_device_only_in_the_same_section():
    from bot.diagnosis.models import Change

    book = next(b for b in load_playbooks() if b.id == "tensor-parallel-mismatch")
    assert book.allows(Change(kind="resources", name="limits.amd.com/gpu", after="2"))
    assert book.allows(Change(kind="resources", name="limits.huawei.com/Ascend910", after="2"))
    assert not book.allows(Change(kind="resources", name="requests.amd.com/gpu", after="2"))
    assert not book.allows(Change(kind="resources", name="limits.memory", after="2"))
    assert not book.allows(Change(kind="resources", name="limits.example.com/widget", after="2"))


@pytest.mark.parametrize("devices", [1, 8])
def test_a_pod_asking_for_an_accelerator_the_data_does_not_know_gets_no_device_change(tmp_path, devices):
    """A vendor the data lacks (here a made-up one): no NVIDIA resource, no TP, and the reason named,
    whatever the node holds. Before, an unknown device fell back to limits.nvidia.com/gpu."""
    resource = "accel.example.com/npu-x9"
    bundle = write_bundle(tmp_path / "b", WEIGHTS_OOM, vendor_pod(resource), vendor_node(resource, {}, devices))
    result = diagnose(load_bundle(bundle))
    assert not device_changes(result) and tp_after(result) is None
    assert not any("nvidia" in c.name for c in result.changes)
    assert "accel.example.com/npu-x9, an accelerator this bot does not know" in result.explanation


def test_a_known_device_beside_other_extended_resources_is_still_the_pods_device(tmp_path):
    pod = vendor_pod("nvidia.com/gpu")
    pod["spec"]["containers"][0]["resources"]["limits"].update({"rdma/hca_shared_devices_a": "1",
                                                                 "vendor.example.com/fpga": "1"})
    node = vendor_node("nvidia.com/gpu", VENDORS["nvidia"][1], 4)
    result = diagnose(load_bundle(write_bundle(tmp_path / "b", WEIGHTS_OOM, pod, node)))
    assert set(device_changes(result)) == {"limits.nvidia.com/gpu"} and tp_after(result) in (2, 4)
