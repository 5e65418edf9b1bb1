"""A small exporter serving dcgm-exporter's GPU memory metrics, for a real Prometheus to scrape.

Names, labels and units as NVIDIA's dcgm-exporter prints them (frame buffer in MiB; `Hostname`,
`gpu`, `UUID`, `device`, `modelName`, and `pod`/`namespace`/`container` with its kubernetes
mapping on):

    DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-…",device="nvidia0",modelName="NVIDIA A10G",Hostname="gpu-node-1",
                        container="vllm",namespace="inference",pod="…"} 20012

`used_mib` is a function of the seconds since start(), so a test can script a climb.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from standin_http import MetricsExporter


@dataclass
class Gpu:
    hostname: str
    index: int = 0
    uuid: str = "GPU-5f1c5e58-8a3c-1d2e-9f0b-2c3d4e5f6a7b"
    model: str = "NVIDIA A10G"
    capacity_mib: int = 23028
    used_mib: Callable[[float], float] = field(default=lambda t: 20000.0)
    pod: tuple[str, str, str] | None = None  # (namespace, pod, container) when mapped


class DcgmExporter(MetricsExporter):
    name = "dcgm-exporter"

    def __init__(self, gpus: list[Gpu]):
        self.gpus = gpus
        self.started = time.monotonic()

    def text(self) -> str:
        t = time.monotonic() - self.started
        lines = ["# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).", "# TYPE DCGM_FI_DEV_FB_FREE gauge",
                 "# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).", "# TYPE DCGM_FI_DEV_FB_USED gauge"]
        for g in self.gpus:
            labels = (f'gpu="{g.index}",UUID="{g.uuid}",device="nvidia{g.index}",modelName="{g.model}",'
                      f'Hostname="{g.hostname}",DCGM_FI_DRIVER_VERSION="550.54.15"')
            if g.pod:
                labels += f',namespace="{g.pod[0]}",pod="{g.pod[1]}",container="{g.pod[2]}"'
            used = min(g.capacity_mib, int(g.used_mib(t)))
            lines += [f"DCGM_FI_DEV_FB_USED{{{labels}}} {used}", f"DCGM_FI_DEV_FB_FREE{{{labels}}} {g.capacity_mib - used}"]
        return "\n".join(lines) + "\n"
