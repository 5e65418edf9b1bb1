"""A real Prometheus (Debian's `prometheus`), started on 127.0.0.1 with a temporary config and
storage, scraping one stand-in exporter every second (tests/kubeapi/dcgm.py, vllm_metrics.py)."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from datetime import UTC, datetime, timedelta

from builders import free_port, require

from bot.kube.prometheus import Prometheus


class RealPrometheus:
    def __init__(self, target: str, folder, job: str = "dcgm-exporter", honor_labels: bool = False):
        binary = require("prometheus", "apt-get install prometheus")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = folder / "prometheus.yml"
        config.write_text(f"""
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: {job}
    honor_labels: {str(honor_labels).lower()}
    static_configs:
      - targets: ["{target}"]
""")
        self.proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}",
                                      f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn",
                                      "--scrape.discovery-reload-interval=100ms"],
                                     stdout=subprocess.DEVNULL, stderr=(folder / "prometheus.log").open("wb"))
        self.log = folder / "prometheus.log"
        deadline = time.monotonic() + 120  # bounds a failure: a loaded machine starts it slowly
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise AssertionError("prometheus never became ready")

    def wait_for_samples(self, n: int, timeout: float = 90) -> None:
        prom, deadline = Prometheus(self.url), time.monotonic() + timeout
        while time.monotonic() < deadline:
            now = datetime.now(UTC)
            series = prom.query_range("DCGM_FI_DEV_FB_USED", now - timedelta(seconds=60), now, 1)
            if series and len({v for _, v in series[0].values}) >= n:
                return
            time.sleep(0.2)
        raise AssertionError(f"fewer than {n} distinct samples scraped")

    def wait_for_series(self, query: str, timeout: float = 90) -> None:
        prom, deadline = Prometheus(self.url), time.monotonic() + timeout
        while time.monotonic() < deadline:
            now = datetime.now(UTC)
            if prom.query_range(query, now - timedelta(seconds=5), now, 1):
                return
            time.sleep(0.2)
        raise AssertionError(f"no series for {query} within {timeout} s")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
