"""Cloud instance types that hold a model's weights (data/instances.yaml). Pure.

Advice names machines a person can order: for weights of W GiB, the fewest GPUs (a power of two,
for tensor parallelism) that each keep their share under 80% of the device, on the smallest
instance of each cloud that has that many.
"""

# No `from __future__ import annotations`: see bot/diagnosis/models.py (pydantic start-up cost).
from functools import lru_cache
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict

INSTANCES_FILE = Path(__file__).with_name("data") / "instances.yaml"  # a file, as in accelerators.py
SHARE = 0.8  # a GPU holds weights up to 80% of its memory, the rest for activations and KV cache


class Instance(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    instance_type: str
    cloud: str
    gpu_product: str
    gpu_count: int
    gpu_memory_gib: float


class Placement(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    instance: Instance
    gpus: int  # tensor-parallel ranks the weights need on it


@lru_cache(maxsize=1)
def catalogue() -> tuple[Instance, ...]:
    text = INSTANCES_FILE.read_text()
    return tuple(Instance.model_validate(row) for row in yaml.safe_load(text))


def gpus_needed(weights_gib: float, device_gib: float) -> int | None:
    """The smallest power-of-two TP whose share of the weights fits 80% of one device (at most 8)."""
    need = 1
    while need <= 8:
        if weights_gib / need <= SHARE * device_gib:
            return need
        need *= 2
    return None


def placements(weights_gib: float, limit: int = 5) -> list[Placement]:
    """The instances that hold the weights, least GPU memory first, one per product and GPU count."""
    found: dict[tuple[str, int], Placement] = {}
    for inst in catalogue():
        need = gpus_needed(weights_gib, inst.gpu_memory_gib)
        if need is None or need > inst.gpu_count:
            continue
        key = (inst.gpu_product, need)
        best = found.get(key)
        if best is None or inst.gpu_count < best.instance.gpu_count:
            found[key] = Placement(instance=inst, gpus=need)
    ranked = sorted(found.values(), key=lambda p: (p.gpus * p.instance.gpu_memory_gib, p.instance.gpu_count))
    return ranked[:limit]
