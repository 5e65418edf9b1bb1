"""How long `vllm-oncall diagnose` takes on a 100 MB and a 1 GB log, and how much memory it needs,
beside the floor: one `grep -c` pass over the same file.

Each run is a fresh process (as a user runs it), timed wall-clock; peak RSS comes from the
kernel's accounting of that child (ru_maxrss, from wait4). Each diagnose run is paired with a
grep run just before it, so both see the same load; the median of the runs is the figure to
quote. Issue 20's targets: within 5x of the floor at 100 MB, 10x at 1 GB, peak RSS under
80 MiB, `--help` under 0.2 CPU-s. A second, pathological log (a keyword on every line) shows
the worst case (at sizes up to 100 MB). The package is byte-compiled first and the children
may write bytecode, as after `pip install` (a PYTHONDONTWRITEBYTECODE environment would
otherwise compile every module on every run).

Printed per log: the median wall and CPU seconds, the floor's, the wall ratio ("x floor", the
target's measure) and the CPU ratio ("x CPU": on a shared machine the wall ratio swings with the
load; both processes are single-threaded, so a quiet machine's wall ratio approaches the CPU one).

Last measured 2026-12-03 16:40-17:05 UTC, the branch `diagstart` against main (d66dc9a) on 2 shared
cores at load average 3-11 (other helpers' suites), so the steady figure is the instruction count
(valgrind --tool=callgrind): a 2 MB log's diagnose 1,096 M -> 1,001 M (-8.7%), 100 MB 2,503 M ->
2,408 M (-3.8%), `--help` 191 M both. CPU seconds, interleaved pairs of single runs, median: 21
pairs at load 4.3-4.5, 100 MB 0.413 -> 0.388 (grep 0.082: 5.0x -> 4.7x; the branch faster in 13 of
21), 2 MB 0.243 -> 0.212 (18 of 21; more than the instructions say: the imports left out also made
system calls); 11 pairs at load 7-10, 2 MB 0.356 -> 0.307, 100 MB 0.519 -> 0.490; this bench
A B A B at load 9-11: 100 MB 0.52, 0.45 -> 0.41, 0.43 CPU-s (x CPU 6.0, 5.3 -> 5.0, 5.1; the wall
ratios swung 5.6-7.6x with the load), 43-44 MiB; 1 GB 1.90 CPU-s (2.2x CPU), 47 MiB; `--help`
0.05-0.09 CPU-s. Diagnoses byte-identical: 101 of 101 by tests/tools/diagnoses_snapshot.py
(fixtures, corpus, the 2 MB, 100 MB, keyword and 1 GB logs), and `diagnose` of each bench log,
JSON and text. Cut, start-up only:
- pydantic's plugin loader imports importlib.metadata (email, zipfile, csv, ...) when the first
  model is built, before it reads PYDANTIC_DISABLE_PLUGINS: with plugins off, one-shot commands
  give pydantic a loader that answers "no plugins" (bot.cli._no_plugin_loader): -38 M;
- pydantic reads each default factory's signature at class definition: for `list` and `dict` a
  text signature parsed by tokenize (31 fields), for a model class its whole signature; plain
  functions instead (models.empty_list, empty_dict), and one Frozen base for five: -30 M;
- diagnose, eval and playbooks build their own parser alone (argparse makes a help formatter per
  argument; the eleven other commands' parsers): -13 M;
- the shipped data read as files beside the module, not through importlib.resources: -11 M;
- playbooks.py without `from __future__ import annotations`: -3 M.
Measured and not kept: pydantic `defer_build` on every model, again: +1% (1,107 M; a diagnosis of a
log alone builds 21 of the 33 models, the others are nested in those); the collector off for the
whole run: -0.2% at 100 MB. Where a 2 MB log's ~1,000 M go now: Python 88 M; importing pydantic
~405 M (pydantic_core's ~80 TypedDicts, whose string annotations typing compiles one by one;
annotated_types; what its modules import: uuid and platform, zoneinfo, secrets and hmac, ...),
fixed as long as the diagnosis is pydantic models; the diagnosis's modules ~360 M (33 models ~100
M, 25 dataclasses ~60 M, the regexes, vLLM's flag table built at import only for cmdline's
aliases ~9 M); the CLI and the diagnosis itself ~150 M. Not reached: 4.0x at 100 MB.

Measured earlier, 2026-12-03 14:20-14:25 UTC, the branch `diagfast` against main on 2 shared cores,
interleaved (A B A B): this bench, twice each, load average 9-11: 100 MB 0.46-0.48 CPU-s against
main's 0.51-0.55, 5.3-5.5x the floor in CPU (main 6.0-6.1x), 46 MiB; 1 GB 1.85 against 2.11 CPU-s
(2.5x CPU, main 2.8x), 49 MiB; `--help` 0.06 CPU-s. Single runs, 11 each, load 4-8, CPU
medians: 100 MB 0.38 -> 0.36 CPU-s (grep 0.07: 5.4x -> 5.1x), a 2 MB log 0.24 -> 0.22. Instructions
(valgrind --tool=callgrind, steady under load): 100 MB 2,695 M -> 2,530 M (-6.1%), 2 MB 1,199 M ->
1,095 M (-8.6%). Where a 2 MB log's instructions went on main: Python 88 M, importing pydantic
182 M, its first model 310 M (the internals it imports then, importlib.metadata for its plugin
search, the search itself 20 M), the diagnosis's modules ~410 M, the diagnosis ~200 M; the scan
of 100 MB adds ~1,500 M (by cProfile: three Aho-Corasick passes ~0.07-0.08 CPU-s, counting
newlines with bytes.count ~0.035, the mapped blocks ~0.03 user + system). `site` is 60 M of the
88 M, most of it the editable install's finder, which a wheel install does not run. Cut by `diagfast`: the
keywords shared evenly between the three searchers (44/44/45, not 64/64/5: fewer false candidates,
the passes 0.084 -> 0.072 CPU-s per 100 MB); the catalogue's 74 model patterns compiled only when a
name holds their plain start; the redaction token rules and the flag-bound patterns compiled on
first use (the two case-insensitive ones alone were 2%); pydantic's plugin search off for
one-shot commands; no `from __future__ import annotations` in the six modules whose models need
no forward reference (pydantic compiled each field's annotation string: 1.4%). Cut earlier (branch
`startup`): the collector paused while the diagnosis is imported, then frozen (15-20 ms), and
the shipped YAML read from bot/support/parsed_ahead.jsonl without importing PyYAML (~25 ms).
Measured and not kept: deferring every model's schema (pydantic `defer_build`): no difference,
a diagnosis builds nearly all of them; reading the file with read() into blocks instead of the
mapping (more system time: 0.04-0.06 against 0.01-0.03 CPU-s per 100 MB; trimming a block at
its last newline is a second copy); blocks of 256 KiB-1 MiB instead of 2 MiB, and MADV_POPULATE_READ ahead of each
block: no difference; other orders of the keywords between searchers: within the noise. Not
reached: 4.0x at 100 MB (pydantic's import and first model are ~40% of a small log's diagnose).
To see where a run's CPU goes:
`python -X importtime -m bot.cli diagnose --log LOG` (start-up) and
`python -m cProfile -s tottime -m bot.cli diagnose --log LOG` (the scan).

    python benchmarks/bench_diagnose.py [--size-mb 100 1024] [--runs 5]
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
    if size_mb > 100:  # the worst case at 1 GB would take minutes per run: shown at 100 MB
        return {"realistic vLLM log": realistic}
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


def run_once(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds (user + system) and peak RSS (KiB) of one child process."""
    start = time.perf_counter()
    # a pipe, not /dev/null: GNU grep stops at the first match when its output is /dev/null
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) not in (0, 1):  # grep -c exits 1 when nothing matched
        raise SystemExit(f"{argv[0]} failed: {argv}")
    return elapsed, usage.ru_utime + usage.ru_stime, usage.ru_maxrss


def user_env() -> dict[str, str]:
    """The environment of an installed vllm-oncall: bytecode compiled once, then reused."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(HERE.parent / "bot")], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    return env


def measure(log: Path, runs: int, env: dict[str, str]) -> dict[str, float]:
    pairs = [(run_once(["grep", "-c", "Error", str(log)]),
              run_once([sys.executable, "-m", "bot.cli", "diagnose", "--log", str(log), "--format", "json"], env))
             for _ in range(runs)]
    wall = statistics.median(d[0] for _, d in pairs)
    floor = statistics.median(g[0] for g, _ in pairs)
    return {"wall": wall, "cpu": statistics.median(d[1] for _, d in pairs), "floor": floor,
            "floor_cpu": statistics.median(g[1] for g, _ in pairs), "ratio": wall / floor,
            "rss": max(d[2] for _, d in pairs) / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, nargs="+", default=[100, 1024])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    env = user_env()
    print(f"diagnose, {args.runs} runs each (fresh process per run, each beside one `grep -c Error` pass over the "
          f"same file, page cache warm); load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'log':<32}{'median s':>10}{'CPU s':>8}{'floor s':>9}{'floor CPU':>10}{'x floor':>9}{'x CPU':>7}"
          f"{'peak RSS MiB':>14}")
    for size in args.size_mb:
        for label, log in make_logs(size).items():
            m = measure(log, args.runs, env)
            print(f"{label + f' {size} MB':<32}{m['wall']:>10.2f}{m['cpu']:>8.2f}{m['floor']:>9.2f}"
                  f"{m['floor_cpu']:>10.2f}{m['ratio']:>9.1f}{m['cpu'] / m['floor_cpu']:>7.1f}{m['rss']:>14.0f}")
    helps = [run_once([sys.executable, "-m", "bot.cli", "--help"], env) for _ in range(args.runs)]
    print(f"vllm-oncall --help: median {statistics.median(h[1] for h in helps):.3f} CPU-s, "
          f"{statistics.median(h[0] for h in helps):.3f} s wall")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
