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
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = Path(tempfile.gettempdir()) / "vllm-oncall-bench-diagnose"  # generated logs: never in the repo


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


def run_once(argv: list[str]) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds (user + system) and peak RSS (KiB) of one child process."""
    start = time.perf_counter()
    # a pipe, not /dev/null: GNU grep stops at the first match when its output is /dev/null
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) not in (0, 1):  # grep -c exits 1 when nothing matched
        raise SystemExit(f"{argv[0]} failed: {argv}")
    return elapsed, usage.ru_utime + usage.ru_stime, usage.ru_maxrss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=100)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(f"diagnose on a {args.size_mb} MB log, {args.runs} runs each (fresh process per run); "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("the floor: one `grep -c Error` pass over the same file (page cache warm)")
    print(f"{'log':<24}{'median s':>10}{'CPU s':>8}{'floor s':>9}{'x floor':>9}{'peak RSS MiB':>14}")
    for label, log in make_logs(args.size_mb).items():
        runs = [run_once([sys.executable, "-m", "bot.cli", "diagnose", "--log", str(log), "--format", "json"])
                for _ in range(args.runs)]
        floor = statistics.median(run_once(["grep", "-c", "Error", str(log)])[0] for _ in range(args.runs))
        wall = statistics.median(r[0] for r in runs)
        print(f"{label:<24}{wall:>10.2f}{statistics.median(r[1] for r in runs):>8.2f}{floor:>9.2f}"
              f"{wall / floor:>9.1f}{max(r[2] for r in runs) / 1024:>14.0f}")


if __name__ == "__main__":
    main()
