"""What `serve` does to its interpreter once wired (bot/cli/serve.py settle_for_serving): the
start-up heap frozen out of the collector's reach, and threads keeping the GIL longer than
CPython's 5 ms. In a fresh interpreter, so this test's own process is left as it is."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import gc, sys
import bot.diagnosis.diagnose  # something of the start-up heap to freeze
from bot.cli.serve import GIL_SWITCH_SECONDS, settle_for_serving
before = (sys.getswitchinterval(), gc.get_freeze_count())
settle_for_serving()
print(before[0], before[1], sys.getswitchinterval(), gc.get_freeze_count(), GIL_SWITCH_SECONDS)
"""


def test_serve_freezes_the_start_up_heap_and_lets_threads_keep_the_gil_longer():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    interval_before, frozen_before, interval, frozen, wanted = done.stdout.split()
    assert float(interval_before) == 0.005 and int(frozen_before) == 0  # CPython's defaults
    assert float(interval) == float(wanted) > float(interval_before)
    assert int(frozen) > 10_000  # the modules, classes and patterns built at start-up
