"""The GPUs a pod was granted beside the node's, from Pod and Node objects as kubectl prints them."""

from __future__ import annotations

from typing import Any

import pytest

from bot.diagnosis.gpus import card_product, fp8_weights, gpu_grant, mig_profile_gib, product_spec


def pod(limits: dict[str, Any], name: str = "vllm", extra: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    containers = [*(extra or []), {"name": name, "image": "vllm/vllm-openai:v0.11.0",
                                   "args": ["Qwen/Qwen3-8B"], "resources": {"limits": limits}}]
    return {"kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": containers}}


def node(labels: dict[str, str], allocatable: dict[str, str]) -> dict[str, Any]:
    return {"kind": "Node", "metadata": {"name": "n", "labels": labels},
            "status": {"capacity": dict(allocatable), "allocatable": dict(allocatable)}}


H100_NODE = node({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559",
                  "nvidia.com/gpu.count": "8", "nvidia.com/gpu.compute.major": "9",
                  "nvidia.com/gpu.compute.minor": "0"}, {"nvidia.com/gpu": "8", "memory": "2Ti"})


def test_eight_gpu_node_with_a_one_gpu_limit():
    g = gpu_grant(pod({"nvidia.com/gpu": "1", "memory": "64Gi"}), H100_NODE)
    assert (g.granted, g.on_node, g.cards_on_node) == (1, 8, 8)
    assert g.whole_card and g.exclusive and g.can_tensor_parallel
    assert g.memory_gib == pytest.approx(79.65, abs=0.01) and g.memory_source == "node label"
    assert g.compute_capability == (9, 0) and g.compute_source == "node label"
    assert g.describe() == "1 of 8 x NVIDIA-H100-80GB-HBM3 (79.65 GiB)"


def test_requests_count_when_limits_are_absent_and_the_vllm_container_is_picked():
    sidecar = {"name": "proxy", "image": "envoy", "resources": {"limits": {"cpu": "1"}}}
    p = pod({}, extra=[sidecar])
    p["spec"]["containers"][1]["resources"] = {"requests": {"nvidia.com/gpu": 4}}
    g = gpu_grant(p, H100_NODE)
    assert g.granted == 4 and g.resource == "nvidia.com/gpu"


def test_no_gpu_limit_is_zero_granted():
    g = gpu_grant(pod({"cpu": "4"}), H100_NODE)
    assert g.granted == 0 and g.on_node == 8


def test_mig_single_strategy_slice_from_the_product_label():
    labels = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", "nvidia.com/gpu.memory": "9728",
              "nvidia.com/gpu.count": "14", "nvidia.com/mig.strategy": "single"}
    g = gpu_grant(pod({"nvidia.com/gpu": "1"}), node(labels, {"nvidia.com/gpu": "14"}))
    assert g.mig_profile == "1g.10gb" and not g.whole_card and not g.can_tensor_parallel
    assert g.product == "NVIDIA-A100-SXM4-80GB" and g.mig_strategy == "single"
    assert g.memory_gib == 9.5 and g.memory_source == "node label"
    assert g.compute_capability == (8, 0) and g.compute_source == "catalogue"
    assert g.describe() == "1 of 14 MIG 1g.10gb slice of NVIDIA-A100-SXM4-80GB (9.5 GiB)"


def test_mig_single_strategy_ignores_a_memory_label_holding_the_whole_card():
    labels = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb", "nvidia.com/gpu.memory": "81920",
              "nvidia.com/mig.strategy": "single"}
    g = gpu_grant(pod({"nvidia.com/gpu": "1"}), node(labels, {"nvidia.com/gpu": "2"}))
    assert g.memory_gib == 38.0 and g.memory_source == "MIG profile"


def test_mig_mixed_strategy_reads_the_profile_resource_and_its_labels():
    labels = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.memory": "81920",
              "nvidia.com/gpu.count": "1", "nvidia.com/mig.strategy": "mixed",
              "nvidia.com/mig-1g.10gb.count": "7", "nvidia.com/mig-1g.10gb.memory": "9728"}
    g = gpu_grant(pod({"nvidia.com/mig-1g.10gb": "1"}), node(labels, {"nvidia.com/mig-1g.10gb": "7"}))
    assert g.resource == "nvidia.com/mig-1g.10gb" and g.mig_profile == "1g.10gb"
    assert g.memory_gib == 9.5 and g.memory_source == "node label"  # not the card's 80 GiB
    assert (g.granted, g.on_node) == (1, 7) and not g.can_tensor_parallel


def test_mig_mixed_strategy_without_profile_labels_uses_the_profile_name():
    labels = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.memory": "81920",
              "nvidia.com/mig.strategy": "mixed"}
    g = gpu_grant(pod({"nvidia.com/mig-3g.40gb": "1"}), node(labels, {"nvidia.com/mig-3g.40gb": "2"}))
    assert g.memory_gib == 38.0 and g.memory_source == "MIG profile"


def test_time_sliced_card_is_shared_and_counts_replicas_once():
    labels = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-SHARED", "nvidia.com/gpu.memory": "81920",
              "nvidia.com/gpu.count": "8", "nvidia.com/gpu.sharing-strategy": "time-slicing",
              "nvidia.com/gpu.replicas": "4"}
    g = gpu_grant(pod({"nvidia.com/gpu": "2"}), node(labels, {"nvidia.com/gpu": "32"}))
    assert g.shared and g.replicas == 4 and g.sharing_strategy == "time-slicing"
    assert g.product == "NVIDIA-A100-SXM4-80GB" and g.memory_gib == 80.0
    assert (g.on_node, g.cards_on_node) == (8, 8)
    assert g.distinct_devices == 1 and not g.can_tensor_parallel  # two replicas may be one card
    assert g.describe().endswith("time-sliced (4 replicas per GPU)")


def test_renamed_shared_resource_is_shared_without_labels():
    g = gpu_grant(pod({"nvidia.com/gpu.shared": "1"}), node({}, {"nvidia.com/gpu.shared": "4"}))
    assert g.shared and g.resource == "nvidia.com/gpu.shared" and g.granted == 1


def test_the_logged_total_beats_every_label():
    g = gpu_grant(pod({"nvidia.com/gpu": "1"}), H100_NODE, log_total_gib=79.19)
    assert g.memory_gib == 79.19 and g.memory_source == "log"


def test_product_catalogue_fills_missing_memory_and_compute_labels():
    g = gpu_grant(pod({"nvidia.com/gpu": "1"}), node({"nvidia.com/gpu.product": "NVIDIA-L40S"}, {"nvidia.com/gpu": "4"}))
    assert g.memory_gib == pytest.approx(44.99, abs=0.01) and g.memory_source == "catalogue"
    assert g.compute_capability == (8, 9) and g.cards_on_node == 4


def test_family_label_gives_a_lower_bound_for_unknown_products():
    labels = {"nvidia.com/gpu.product": "NVIDIA-Some-New-Card", "nvidia.com/gpu.family": "hopper"}
    g = gpu_grant(pod({"nvidia.com/gpu": "1"}), node(labels, {"nvidia.com/gpu": "1"}))
    assert g.compute_capability == (9, 0) and g.compute_source == "GPU family"
    assert g.memory_gib is None and g.memory_source == "unknown"


def test_amd_gpus():
    labels = {"amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM", "amd.com/gpu.vram": "192G"}
    g = gpu_grant(pod({"amd.com/gpu": "2"}), node(labels, {"amd.com/gpu": "8"}))
    assert g.vendor == "amd" and (g.granted, g.on_node) == (2, 8)
    assert g.memory_gib == 192.0 and g.memory_source == "node label"
    g = gpu_grant(pod({"amd.com/gpu": "1"}), node({"amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM"}, {"amd.com/gpu": "8"}))
    assert g.memory_gib == 192.0 and g.memory_source == "catalogue"


def test_no_pod_and_no_node():
    g = gpu_grant(None, None, log_total_gib=23.58)
    assert g.granted == 0 and g.memory_gib == 23.58 and g.memory_source == "log" and g.product is None


@pytest.mark.parametrize("product, expected", [
    ("NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", "NVIDIA-A100-SXM4-80GB"),
    ("NVIDIA-A100-SXM4-80GB-SHARED", "NVIDIA-A100-SXM4-80GB"),
    ("Tesla-T4", "Tesla-T4"),
])
def test_card_product(product, expected):
    assert card_product(product) == expected


def test_product_spec_prefers_the_longest_fragment():
    assert product_spec("NVIDIA-H100-NVL") == (95830, (9, 0))
    assert product_spec("NVIDIA-H100-80GB-HBM3") == (81559, (9, 0))
    assert product_spec("NVIDIA-A10G") == (23028, (8, 6))
    assert product_spec("Unknown") == (None, None)


def test_mig_profile_memory_is_nominal_rounded_low():
    assert mig_profile_gib("1g.5gb") == 4.75
    assert mig_profile_gib("3g.20gb") == 19.0
    assert mig_profile_gib("bogus") is None


def test_fp8_weight_support_by_compute_capability():
    assert fp8_weights((9, 0)) == "native" and fp8_weights((8, 9)) == "native"
    assert fp8_weights((8, 0)) == "weight-only" and fp8_weights((8, 6), moe=True) == "none"
    assert fp8_weights((7, 5)) == "none" and fp8_weights(None) == "unknown"
