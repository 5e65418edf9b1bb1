"""The GPUs a pod was granted beside the node's: count, slice or card, shared or not, memory. Pure.

Read from the Pod and Node objects exactly as `kubectl get -o yaml` prints them (plain dicts):
- the container's GPU limits: `nvidia.com/gpu` (a card, or a MIG slice under the `single` MIG
  strategy, or a time-sliced replica), `nvidia.com/gpu.shared` (time-slicing with
  renameByDefault), `nvidia.com/mig-<profile>` (the `mixed` MIG strategy), `amd.com/gpu`;
- NVIDIA GPU feature discovery's node labels: `nvidia.com/gpu.product` / `gpu.memory` (MiB) /
  `gpu.count` / `gpu.compute.major|minor` / `gpu.family`, `nvidia.com/mig.strategy`, per-profile
  `nvidia.com/mig-<profile>.memory|count`, `nvidia.com/gpu.replicas` and
  `nvidia.com/gpu.sharing-strategy`; AMD's labeller `amd.com/gpu.product-name` / `amd.com/gpu.vram`;
- the node's allocatable extended resources (how many of the granted kind the node has).
Memory per device has a source tag, most exact first: the vLLM/PyTorch log's total, the node
label, the MIG profile name, the product catalogue below.
"""

# No `from __future__ import annotations`: see bot/diagnosis/models.py (pydantic start-up cost).
import re
from typing import Any, Literal

from bot.diagnosis import accelerators
from bot.diagnosis.evidence import pick_container
from bot.diagnosis.models import Frozen, revised

MemorySource = Literal["log", "node label", "MIG profile", "catalogue", "unknown"]
ComputeSource = Literal["node label", "catalogue", "GPU family", "unknown"]

MIB_PER_GIB = 1024


class GpuGrant(Frozen):
    """What one vLLM container can use. Memory is per device (card or slice), in GiB."""

    vendor: str | None = None  # a vendor of data/accelerators.yaml: nvidia, amd, intel, ascend, tpu
    resource: str | None = None  # the limit's resource name
    granted: int = 0  # devices in the container's limit
    on_node: int | None = None  # devices of that kind the node can allocate (replicas counted once)
    cards_on_node: int | None = None  # physical GPUs on the node
    product: str | None = None  # the card, without '-SHARED' or '-MIG-<profile>'
    memory_gib: float | None = None
    memory_source: MemorySource = "unknown"
    mig_profile: str | None = None  # "1g.10gb" when the device is a MIG slice
    virtual_device: str | None = None  # "Ascend910-8c" when the device is a vendor's slice of one card (vNPU)
    mig_strategy: str | None = None  # "single" | "mixed" | None
    shared: bool = False  # time-sliced or MPS: other pods may use the same device
    sharing_strategy: str | None = None
    replicas: int | None = None
    compute_capability: tuple[int, int] | None = None
    compute_source: ComputeSource = "unknown"

    @property
    def whole_card(self) -> bool:
        return self.mig_profile is None and self.virtual_device is None

    @property
    def exclusive(self) -> bool:
        return not self.shared

    @property
    def distinct_devices(self) -> int:
        """Devices guaranteed to be different: time-sliced replicas may all be one card."""
        return self.granted if not self.shared else min(self.granted, 1)

    @property
    def can_tensor_parallel(self) -> bool:
        """CUDA and NCCL cannot run one model across MIG slices, nor across replicas of one card;
        Ascend gives a pod one vNPU at most, so neither can HCCL across vNPUs."""
        return self.whole_card and not self.shared

    def no_tensor_parallel_reason(self) -> str:
        """Why no model spans these devices, when can_tensor_parallel is False."""
        if self.mig_profile:
            return f"MIG {self.mig_profile} slices: CUDA and NCCL need whole GPUs"
        if self.virtual_device:
            return f"{self.virtual_device} virtual NPUs: each is a slice of one card, and a pod gets one at most"
        return "time-sliced replicas of one GPU: CUDA and NCCL need whole GPUs"

    def describe(self) -> str:
        """'1 of 8 x NVIDIA-H100-80GB-HBM3 (79.65 GiB)', '1 MIG 1g.10gb slice of NVIDIA-A100-SXM4-80GB (9.5 GiB)'."""
        kind = self.product or (self.vendor.upper() + " GPU" if self.vendor else "GPU")
        memory = f" ({self.memory_gib:.2f}".rstrip("0").rstrip(".") + " GiB)" if self.memory_gib else ""
        if self.mig_profile:
            of = f" of {self.on_node}" if self.on_node else ""
            text = f"{self.granted}{of} MIG {self.mig_profile} slice{'s' if self.granted != 1 else ''} of {kind}{memory}"
        elif self.virtual_device:
            of = f" of {self.on_node}" if self.on_node else ""
            text = f"{self.granted}{of} virtual NPU {self.virtual_device} (a slice of one {kind}){memory}"
        else:
            of = f" of {self.cards_on_node} x" if self.cards_on_node else " x"
            text = f"{self.granted}{of} {kind}{memory}"
        if self.shared:
            text += f", time-sliced ({self.replicas} replicas per GPU)" if self.replicas else ", shared"
        return text


# ---- catalogue of GPU products ------------------------------------------------------------------
# product-label fragment -> (memory MiB as NVML reports it, or None when not sure; compute capability)
_PRODUCTS: tuple[tuple[str, int | None, tuple[int, int]], ...] = (
    ("H100-NVL", 95830, (9, 0)), ("H100", 81559, (9, 0)), ("H200", None, (9, 0)), ("GH200", None, (9, 0)),
    ("H800", None, (9, 0)), ("H20", None, (9, 0)), ("GB200", None, (10, 0)), ("B200", None, (10, 0)),
    ("A100-SXM4-80GB", 81920, (8, 0)), ("A100-80GB", 81920, (8, 0)), ("A100-PCIE-80GB", 81920, (8, 0)),
    ("A100-SXM4-40GB", 40960, (8, 0)), ("A100-PCIE-40GB", 40960, (8, 0)), ("A100", None, (8, 0)),
    ("A800", None, (8, 0)), ("A30", None, (8, 0)), ("A10G", 23028, (8, 6)), ("A10", 23028, (8, 6)),
    ("A40", 46068, (8, 6)), ("RTX-A6000", None, (8, 6)), ("RTX-6000-ADA", None, (8, 9)),
    ("L40S", 46068, (8, 9)), ("L40", 46068, (8, 9)), ("L4", 23034, (8, 9)),
    ("RTX-5090", None, (12, 0)), ("RTX-5080", 16303, (12, 0)), ("RTX-4090", 24564, (8, 9)),
    ("RTX-3090", 24576, (8, 6)), ("RTX-2080-TI", 11264, (7, 5)), ("T4", 15360, (7, 5)),
    ("V100-SXM2-16GB", 16384, (7, 0)), ("V100-SXM2-32GB", 32768, (7, 0)), ("V100", None, (7, 0)),
)
# GPU feature discovery's family label -> the lowest compute capability of that family
_FAMILIES = {"volta": (7, 0), "turing": (7, 5), "ampere": (8, 0), "ada-lovelace": (8, 9), "lovelace": (8, 9),
             "hopper": (9, 0), "blackwell": (10, 0)}

_MIG_IN_PRODUCT = re.compile(r"-MIG-(\d+g\.\d+gb(?:\+me)?)$", re.I)
_MIG_PROFILE = re.compile(r"^(\d+)g\.(\d+)gb(?:\+me)?$")
_MIG_RESOURCE = re.compile(r"^nvidia\.com/mig-(\d+g\.\d+gb(?:\+me)?)$")


def product_spec(product: str | None) -> tuple[int | None, tuple[int, int] | None]:
    """(memory MiB or None, compute capability or None) for a GFD product label."""
    if not product:
        return None, None
    name = card_product(product).upper().replace(" ", "-")
    for fragment, memory, cc in _PRODUCTS:
        if fragment in name:
            return memory, cc
    return None, None


def card_product(product: str) -> str:
    """'NVIDIA-A100-SXM4-80GB' from 'NVIDIA-A100-SXM4-80GB-SHARED' or '...-MIG-1g.10gb'."""
    name = _MIG_IN_PRODUCT.sub("", product.strip())
    return re.sub(r"-SHARED$", "", name, flags=re.I)


def mig_profile_gib(profile: str) -> float | None:
    """A MIG profile's memory from its name: NVML reports about 95 % of the nominal 'Ngb'
    (1g.5gb = 4864 MiB, 3g.20gb = 19968 MiB), so this is slightly low, never high."""
    m = _MIG_PROFILE.match(profile.lower())
    return round(int(m.group(2)) * 0.95, 2) if m else None


def compute_capability_label(major: Any, minor: Any) -> tuple[int, int] | None:
    try:
        return int(str(major)), int(str(minor or 0))
    except (TypeError, ValueError):
        return None


def fp8_weights(cc: tuple[int, int] | None, moe: bool = False) -> Literal["native", "weight-only", "none", "unknown"]:
    """FP8 weights per vLLM's quantization docs: W8A8 on compute capability 8.9+ (Ada, Hopper,
    Blackwell), weight-only W8A16 through FP8 Marlin on Ampere (8.0-8.6), MoE models only on 8.9+.
    Turing gained the Marlin path only in newer releases: that is the caller's, who knows the version."""
    if cc is None:
        return "unknown"
    if cc >= (8, 9):
        return "native"
    if cc >= (8, 0) and not moe:
        return "weight-only"
    return "none"


# ---- reading the pod and node ---------------------------------------------------------------------


def _count(value: Any) -> int | None:
    try:
        return int(float(str(value)))
    except (TypeError, ValueError):
        return None


def _gpu_limits(container: dict[str, Any] | None) -> dict[str, int]:
    """Device resources the container asks for: limits, else requests (extended resources need one)."""
    resources = (container or {}).get("resources") or {}
    return accelerators.device_limits(resources.get("limits") or resources.get("requests") or {})


def _pick_resource(limits: dict[str, int]) -> tuple[str | None, int]:
    return accelerators.pod_device_resource(limits)


def _node_parts(node: dict[str, Any] | None) -> tuple[dict[str, str], dict[str, Any]]:
    node = node or {}
    labels = {str(k): str(v) for k, v in ((node.get("metadata") or {}).get("labels") or {}).items()}
    status = node.get("status") or {}
    allocatable = status.get("allocatable") or status.get("capacity") or {}
    return labels, allocatable


def gpu_grant(pod: dict[str, Any] | None, node: dict[str, Any] | None, container: str | None = None,
              log_total_gib: float | None = None) -> GpuGrant:
    """The GPUs the vLLM container was granted and what they are.

    log_total_gib: the device total vLLM or PyTorch printed ("total_gpu_memory (T GiB)", "Free
    memory on device (F/T GiB)", "GPU 0 has a total capacity of T GiB"): it beats any label."""
    picked = pick_container(pod, container) if pod else None
    resource, granted = _pick_resource(_gpu_limits(picked))
    labels, allocatable = _node_parts(node)
    vendor = accelerators.vendor_of(resource) if resource else next(
        (v for v in accelerators.vendors() if any(v.owns(str(n)) for n in allocatable)), None)
    if vendor is not None and vendor.vendor != "nvidia":
        grant = _vendor_grant(vendor, resource, labels, allocatable, granted)
    else:
        grant = _nvidia_grant(resource, granted, labels, allocatable)
    if log_total_gib:
        grant = revised(grant, memory_gib=round(float(log_total_gib), 2), memory_source="log")
    return grant


def _nvidia_grant(resource: str | None, granted: int, labels: dict[str, str],
                  allocatable: dict[str, Any]) -> GpuGrant:
    nvidia = accelerators.vendors()[0]
    # GPU feature discovery's labels, else GKE's (gke-accelerator, gke-gpu-sharing-strategy, ...)
    raw_product = nvidia.first_label(labels, nvidia.product_labels)
    strategy = labels.get("nvidia.com/mig.strategy") or None
    sharing = nvidia.first_label(labels, nvidia.strategy_labels)
    replicas = _count(nvidia.first_label(labels, nvidia.replicas_labels))
    shared = bool((replicas or 1) > 1 or (sharing and sharing not in nvidia.not_shared)
                  or resource == "nvidia.com/gpu.shared"
                  or (raw_product or "").upper().endswith("-SHARED"))
    per_device = replicas if shared and replicas and replicas > 1 else 1
    profile = _mig_profile(resource, raw_product)
    on_node = _count(allocatable.get(resource or "nvidia.com/gpu"))
    if on_node is not None:
        on_node //= per_device
    memory, source = _nvidia_memory(profile, resource, labels, raw_product)
    cc, cc_source = _compute(labels, raw_product)
    cards = _count(nvidia.first_label(labels, nvidia.count_labels))
    if cards is None and not profile:
        cards = on_node
    return GpuGrant(
        vendor="nvidia" if (resource or raw_product or on_node) else None, resource=resource, granted=granted,
        on_node=on_node, cards_on_node=cards, product=card_product(raw_product) if raw_product else None,
        memory_gib=memory, memory_source=source, mig_profile=profile,
        mig_strategy=strategy or ("mixed" if resource and _MIG_RESOURCE.match(resource) else None),
        shared=shared, sharing_strategy=sharing, replicas=replicas,
        compute_capability=cc, compute_source=cc_source,
    )


def _mig_profile(resource: str | None, product: str | None) -> str | None:
    m = _MIG_RESOURCE.match(resource or "")
    if m:
        return m.group(1)
    m = _MIG_IN_PRODUCT.search(product or "")
    return m.group(1).lower() if m else None


def _nvidia_memory(profile: str | None, resource: str | None, labels: dict[str, str],
                   product: str | None) -> tuple[float | None, MemorySource]:
    nominal = mig_profile_gib(profile) if profile else None
    if profile and resource and _MIG_RESOURCE.match(resource):
        # mixed strategy: gpu.memory is the whole card; the profile has its own label
        mib = _count(labels.get(f"nvidia.com/mig-{profile}.memory"))
        if mib:
            return round(mib / MIB_PER_GIB, 2), "node label"
        return nominal, "MIG profile" if nominal else "unknown"
    mib = _count(labels.get("nvidia.com/gpu.memory"))
    if mib and not (nominal and mib / MIB_PER_GIB > nominal * 1.25):
        return round(mib / MIB_PER_GIB, 2), "node label"
    if nominal:
        return nominal, "MIG profile"  # a label holding the whole card's memory is not the slice's
    catalogue_mib, _ = product_spec(product)
    if catalogue_mib:
        return round(catalogue_mib / MIB_PER_GIB, 2), "catalogue"
    m = re.search(r"(\d+)GB", card_product(product or ""), re.I)
    if m:
        return float(m.group(1)) * 0.95, "catalogue"  # the product name's nominal size, rounded low
    return None, "unknown"


def _compute(labels: dict[str, str], product: str | None) -> tuple[tuple[int, int] | None, ComputeSource]:
    if "nvidia.com/gpu.compute.major" in labels:
        cc = compute_capability_label(labels["nvidia.com/gpu.compute.major"], labels.get("nvidia.com/gpu.compute.minor"))
        if cc:
            return cc, "node label"
    _, cc = product_spec(product)
    if cc:
        return cc, "catalogue"
    family = _FAMILIES.get((labels.get("nvidia.com/gpu.family") or "").lower())
    return (family, "GPU family") if family else (None, "unknown")


def _vendor_grant(vendor: accelerators.Vendor, resource: str | None, labels: dict[str, str],
                  allocatable: dict[str, Any], granted: int) -> GpuGrant:
    """AMD, Intel, Ascend, TPU: product and memory from the vendor's labels, else its catalogue."""
    product = vendor.first_label(labels, vendor.product_labels)
    virtual = resource.rpartition("/")[2] if resource and vendor.is_slice(resource) else None
    if product is None and resource and vendor.resource_patterns:
        # huawei.com/Ascend910 names the chip itself; huawei.com/Ascend910-8c a vNPU of one
        product = virtual.partition("-")[0] if virtual else resource.rpartition("/")[2]
    memory: float | None = vendor.memory_gib(labels)
    source: MemorySource = "node label" if memory else "unknown"
    if virtual:  # a vNPU holds a part of the card: the card's labels and catalogue overstate it
        memory, source = None, "unknown"
    elif memory is None:
        memory = vendor.catalogue_gib(product)
        source = "catalogue" if memory else "unknown"
    on_node = accelerators.node_devices(allocatable, resource)
    cards = _count(vendor.first_label(labels, vendor.count_labels)) or on_node
    return GpuGrant(vendor=vendor.vendor, resource=resource if granted else None, granted=granted, on_node=on_node,
                    cards_on_node=cards, product=product, memory_gib=memory, memory_source=source,
                    virtual_device=virtual)
