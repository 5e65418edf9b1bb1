"""Accelerator vendors as data (data/accelerators.yaml): which extended resources are devices,
which node labels name the product, its memory and count, and which say the devices are shared.
Pure; read once."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from bot.support import yamlload

# The shipped data is read as a file beside this module, as vllm_versions and playbooks read
# theirs: importing importlib.resources and resolving the package through it cost 1.1% of the
# instructions of a small log's diagnose (issue 20).
ACCELERATORS_FILE = Path(__file__).with_name("data") / "accelerators.yaml"

@dataclass(frozen=True)
class Vendor:
    vendor: str
    resources: tuple[str, ...]
    resource_patterns: tuple[re.Pattern[str], ...]
    product_labels: tuple[str, ...]
    memory_labels: tuple[str, ...]
    memory_unit: str
    count_labels: tuple[str, ...]
    fp8: str
    strategy_labels: tuple[str, ...] = ()
    not_shared: tuple[str, ...] = ()
    replicas_labels: tuple[str, ...] = ()
    products: tuple[tuple[str, float], ...] = field(default=())
    alloc_env: str | None = None  # the allocator's configuration variable (expandable segments)
    slice_patterns: tuple[re.Pattern[str], ...] = ()  # a part of one card each (Ascend vNPU)

    def owns(self, resource: str) -> bool:
        return (resource in self.resources or any(p.fullmatch(resource) for p in self.resource_patterns)
                or self.is_slice(resource))

    def is_slice(self, resource: str) -> bool:
        return any(p.fullmatch(resource) for p in self.slice_patterns)

    def first_label(self, labels: dict[str, str], keys: tuple[str, ...]) -> str | None:
        return next((labels[k] for k in keys if labels.get(k)), None)

    def memory_gib(self, labels: dict[str, str]) -> float | None:
        """The per-device memory label in GiB, in the unit the vendor writes it."""
        raw = self.first_label(labels, self.memory_labels)
        if raw is None:
            return None
        m = re.match(r"^\s*(\d+(?:\.\d+)?)", raw)
        if not m:
            return None
        value = float(m.group(1))
        if self.memory_unit == "MiB":
            return round(value / 1024, 2)
        if self.memory_unit == "bytes":
            return round(value / 2**30, 2)
        return value

    def catalogue_gib(self, product: str | None) -> float | None:
        name = (product or "").upper().replace("-", " ").replace("_", " ")
        squashed = name.replace(" ", "")
        return next((gib for frag, gib in self.products
                     if frag.upper() in name or frag.upper().replace(" ", "") in squashed), None)


def _vendor(raw: dict[str, Any]) -> Vendor:
    sharing = raw.get("sharing") or {}
    products = sorted(((str(k), float(v)) for k, v in (raw.get("products") or {}).items()),
                      key=lambda kv: -len(kv[0]))  # the longest fragment first: 910B before 910
    return Vendor(
        vendor=str(raw["vendor"]), resources=tuple(raw.get("resources") or ()),
        resource_patterns=tuple(re.compile(p) for p in raw.get("resource_patterns") or ()),
        product_labels=tuple(raw.get("product_labels") or ()), memory_labels=tuple(raw.get("memory_labels") or ()),
        memory_unit=str(raw.get("memory_unit") or "GiB-text"), count_labels=tuple(raw.get("count_labels") or ()),
        fp8=str(raw.get("fp8")), strategy_labels=tuple(sharing.get("strategy_labels") or ()),
        not_shared=tuple(str(v) for v in sharing.get("not_shared") or ()),
        replicas_labels=tuple(sharing.get("replicas_labels") or ()), products=tuple(products),
        alloc_env=raw.get("alloc_env"),
        slice_patterns=tuple(re.compile(p) for p in raw.get("slice_patterns") or ()))


@cache
def vendors() -> tuple[Vendor, ...]:
    text = ACCELERATORS_FILE.read_text(encoding="utf-8")
    return tuple(_vendor(v) for v in yamlload.safe_load(text)["vendors"])


def vendor_of(resource: str) -> Vendor | None:
    return next((v for v in vendors() if v.owns(resource)), None)


def is_device_resource(resource: str) -> bool:
    return vendor_of(resource) is not None


# Extended resources that are not accelerators: a pod may ask for them beside (or without) a device.
_NOT_DEVICES = ("hugepages-", "kubernetes.io/", "rdma/", "smarter-devices/", "squat.ai/", "github.com/fuse")


def unknown_devices(limits: dict[str, Any]) -> list[str]:
    """Extended resources (vendor.example/name) a container asks for that the data names neither as
    a device nor as a known non-device: a vendor's accelerator this bot does not know (a new card,
    a vendor's slice). Only meaningful when the container asks for no known device."""
    out = []
    for name, value in limits.items():
        resource = str(name)
        if "/" not in resource or resource.startswith(_NOT_DEVICES) or is_device_resource(resource):
            continue
        try:
            if int(float(str(value))) > 0:
                out.append(resource)
        except (TypeError, ValueError):
            continue
    return sorted(out)


def device_limits(limits: dict[str, Any]) -> dict[str, int]:
    """The accelerator resources among a container's limits (or requests), as counts."""
    out: dict[str, int] = {}
    for name, value in limits.items():
        try:
            n = int(float(str(value)))
        except (TypeError, ValueError):
            continue
        if n and is_device_resource(str(name)):
            out[str(name)] = n
    return out


def pod_device_resource(limits: dict[str, Any]) -> tuple[str | None, int]:
    """The device resource a container asks for, in the data's vendor order (whole devices first)."""
    found = device_limits(limits)
    for v in vendors():
        for name in v.resources:
            if name in found:
                return name, found[name]
        patterned = sorted(n for n in found if any(p.fullmatch(n) for p in v.resource_patterns) or v.is_slice(n))
        if patterned:
            return patterned[0], found[patterned[0]]
    return None, 0


def node_devices(allocatable: dict[str, Any], resource: str | None) -> int | None:
    """How many devices of `resource` (or of any accelerator, when None) the node can allocate."""
    names = [resource] if resource else [str(n) for n in allocatable if is_device_resource(str(n))]
    for name in names:
        try:
            return int(float(str(allocatable[name])))
        except (KeyError, TypeError, ValueError):
            continue
    return None
