"""Unclear messages made clear (issue 19): one line saying what happened and what to do."""

from __future__ import annotations

import gzip
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = ROOT / "examples" / "incident" / "bundle"


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bot.cli", *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd)


def test_diagnose_refuses_a_bundle_and_a_log_together(tmp_path):
    log = tmp_path / "other.log"
    log.write_text("hello\n")
    done = run("diagnose", str(BUNDLE), "--log", str(log), cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.strip().splitlines()
    assert "not both" in line and str(BUNDLE) in line and str(log) in line


def test_eval_on_a_folder_without_bundles_exits_2_and_says_so(tmp_path):
    (tmp_path / "empty").mkdir()
    done = run("eval", str(tmp_path / "empty"), cwd=tmp_path)
    assert done.returncode == 2 and "0/0" not in done.stdout
    [line] = done.stderr.strip().splitlines()
    assert "no labelled bundles found" in line


def test_an_unknown_flag_prints_the_subcommands_usage(tmp_path):
    done = run("diagnose", "--bogus", cwd=tmp_path)
    assert done.returncode == 2
    assert "usage: vllm-oncall diagnose" in done.stderr and "unrecognized arguments: --bogus" in done.stderr


def test_a_gzip_log_is_named_with_gunzip(tmp_path):
    log = tmp_path / "previous.log.gz"
    log.write_bytes(gzip.compress((BUNDLE / "previous.log").read_bytes()))
    done = run("diagnose", "--log", str(log), cwd=tmp_path)
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert "gzip-compressed" in line and f"gunzip -k {log}" in line
    bundle = tmp_path / "bundle"
    shutil.copytree(BUNDLE, bundle)
    (bundle / "previous.log").write_bytes(log.read_bytes())
    done = run("diagnose", str(bundle), cwd=tmp_path)
    assert done.returncode == 2 and "gzip-compressed" in done.stderr


def test_demo_approve_says_the_manifest_it_names_is_removed_or_keeps_it(tmp_path):
    done = run("demo", "--approve", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "kubectl apply -f" in done.stdout
    assert "Temporary state removed, with the patched manifest" in done.stdout and "--state-dir DIR" in done.stdout
    kept = run("demo", "--approve", "--state-dir", str(tmp_path / "state"), cwd=tmp_path)
    assert kept.returncode == 0 and list((tmp_path / "state" / "cluster").glob("*.yaml"))
