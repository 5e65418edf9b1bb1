"""How long `vllm-oncall diagnose` takes on a 100 MB log, and how much memory it needs.

Each run is a fresh process (as a user runs it), timed wall-clock; peak RSS comes from the
kernel's accounting of that child (ru_maxrss). The machine is noisy: the median of the runs
is the figure to quote. A second, pathological log (a keyword on every line) shows the
worst case.

    python benchmarks/bench_diagnose.py [--size-mb 100] [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"


def make_logs(size_mb: int) -> dict[str, Path]:
    OUT.mkdir(exist_ok=True)
    realistic = OUT / f"realistic-{size_mb}mb.log"
    if not realistic.exists():
        subprocess.run([sys.executable, str(HERE / "make_big_log.py"), str(realistic), "--size-mb", str(size_mb)],
                       check=True)
    worst = OUT / f"keyword-every-line-{size_mb}mb.log"
    if not worst.exists():
        line = ('WARNING 10-25 13:00:{s:02d} [utils.py:12] RuntimeError: retry {n} failed in File "/x/vllm/a.py", '
                'line {n}, in load_model: CUDA error, NCCL memory\n')
        with worst.open("w") as fh:
            written, n = 0, 0
            while written < size_mb * 2**20:
                text = line.format(s=n % 60, n=n)
                fh.write(text)
                written += len(text)
                n += 1
    return {"realistic vLLM log": realistic, "keyword on every line": worst}


def run_once(log: Path) -> tuple[float, int]:
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "bot.cli", "diagnose", "--log", str(log), "--format", "json"],
                            stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    if status != 0:
        raise SystemExit(f"diagnose failed on {log}")
    return elapsed, usage.ru_maxrss  # KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=100)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(f"diagnose on a {args.size_mb} MB log, {args.runs} runs each (fresh process per run)")
    print(f"{'log':<24}{'median s':>10}{'min s':>8}{'max s':>8}{'peak RSS MiB':>14}")
    for label, log in make_logs(args.size_mb).items():
        times, rss = [], []
        for _ in range(args.runs):
            t, r = run_once(log)
            times.append(t)
            rss.append(r)
        print(f"{label:<24}{statistics.median(times):>10.2f}{min(times):>8.2f}{max(times):>8.2f}"
              f"{max(rss) / 1024:>14.0f}")


if __name__ == "__main__":
    main()
