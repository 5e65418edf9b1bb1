"""How much CPU the redaction of one incident's evidence costs: `redact()` over a realistic vLLM
log (benchmarks/make_big_log.py, written to /tmp, never committed).

CPU seconds (process_time) per pass, the median of several passes, with the load average when it
ran (the machine is shared: read the median). `--rules` adds the cost of each built-in rule alone,
to see which one dominates.

    python benchmarks/bench_redact.py [--size-mb 2] [--runs 5] [--rules]
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
sys.path.insert(0, str(HERE.parent))

from bot.diagnosis import redact as redact_module  # noqa: E402


def log_text(size_mb: int) -> str:
    path = Path(tempfile.gettempdir()) / f"vllm-oncall-bench-redact-{size_mb}mb.log"
    if not path.exists():
        subprocess.run([sys.executable, str(HERE / "make_big_log.py"), str(path), "--size-mb", str(size_mb)],
                       check=True, stdout=subprocess.DEVNULL)
    return path.read_text(encoding="utf-8", errors="replace")


def cpu(fn, text: str, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.process_time()
        fn(text)
        times.append(time.process_time() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=2)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rules", action="store_true", help="also time each built-in rule alone")
    args = parser.parse_args()
    text = log_text(args.size_mb)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {len(text) / 1e6:.1f} MB of log")
    print(f"redact(): median {cpu(redact_module.redact, text, args.runs):.3f} CPU-s over {args.runs} runs")
    # the floor: one pass of one simple regex over the same text
    floor = cpu(lambda t: sum(1 for _ in redact_module.re.finditer(r"hf_", t)), text, args.runs)
    print(f"floor (one literal scan): median {floor:.3f} CPU-s")
    if args.rules:
        for rule in redact_module.TOKEN_RULES:
            print(f"  {rule.name:28s} {cpu(lambda t, r=rule: r.pattern.sub(r.replacement, t), text, 1):.3f}")
        print(f"  {'structure':28s} {cpu(redact_module.redact_structure, text, 1):.3f}")
        print(f"  {'base64':28s} {cpu(lambda t: redact_module._BASE64.sub(redact_module._base64_secret, t), text, 1):.3f}")


if __name__ == "__main__":
    main()
