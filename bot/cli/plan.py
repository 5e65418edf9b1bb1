"""`vllm-oncall plan`: the memory model before a crash, for CI and pre-deploy checks.

    vllm-oncall plan deploy.yaml --node node.yaml
    vllm-oncall plan deploy.yaml --gpu NVIDIA-H100-80GB-HBM3 --gpus 8 --format json
    vllm-oncall plan deploy.yaml --vllm-version 0.33          # before an upgrade: the flags
    vllm-oncall plan deploy.yaml --vllm-version 0.33 --node node.yaml   # both checks

With --vllm-version (and no node) only the command line is checked: every flag of the
manifest's vLLM containers against that release's flags, read from its wheel.

Exit status: 0 the workload fits (and the release accepts every flag), 1 it does not or cannot
be judged (or the release lacks or renamed a flag), 2 bad input (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from bot.diagnosis import cmdline
from bot.diagnosis.flag_drift import FlagCheck, check_release
from bot.diagnosis.preflight import PlanError, gpu_node, plan, render
from bot.diagnosis.vllm_versions import TABLE, version_key
from bot.remedy.changes import pod_spec_of


def _yaml_file(path: str, what: str) -> list[Any]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise PlanError(f"{path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise PlanError(f"{path}: not a text file") from None
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise PlanError(f"{path}: not valid YAML{where}") from None
    if not docs:
        raise PlanError(f"{path}: empty, expected a {what}")
    return docs


def _workload(path: str) -> dict[str, Any]:
    docs = _yaml_file(path, "Deployment, StatefulSet or Pod")
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") in {"Deployment", "StatefulSet", "Pod", "DaemonSet", "Job", "ReplicaSet"}:
            return doc
    raise PlanError(f"{path}: no Deployment, StatefulSet or Pod in it")


def _node(args: argparse.Namespace) -> dict[str, Any] | None:
    if args.node and args.gpu:
        raise PlanError("give --node or --gpu, not both")
    if args.node:
        doc = _yaml_file(args.node, "Node")[0]
        if not isinstance(doc, dict) or doc.get("kind", "Node") != "Node":
            raise PlanError(f"{args.node}: not a Node (kubectl get node NAME -o yaml)")
        return doc
    if args.gpu:
        if args.gpus < 1:
            raise PlanError("--gpus must be at least 1")
        return gpu_node(args.gpu, args.gpus)
    raise PlanError("give the node the pod will run on: --node NODE.yaml, or --gpu PRODUCT [--gpus N]")


def _release(version: str) -> str:
    """The read release standing for --vllm-version, or a PlanError naming what is known."""
    table = TABLE()
    if version_key(version) is None:
        raise PlanError(f"--vllm-version {version!r} is not a vLLM version (such as 0.17.1)")
    release = table.release_for(version)
    if release is None:
        raise PlanError(f"--vllm-version {version}: the flag table holds vLLM {table.releases[0]} to "
                        f"{table.releases[-1]} (regenerate it with tests/tools/vllm_flags_table.py --add {version})")
    return release


def _vllm_commands(workload: dict[str, Any], path: str) -> list[tuple[str, cmdline.ParsedCommand]]:
    """Each container that runs vLLM, with its parsed command line."""
    out = []
    for c in pod_spec_of(workload).get("containers") or []:
        parsed = cmdline.parse(_strs(c.get("command")), _strs(c.get("args")))
        named = parsed.entrypoint in ("vllm serve", "api_server") or "vllm" in str(c.get("image", "")).lower()
        if parsed.found_vllm and named:
            out.append((str(c.get("name", "")), parsed))
    if not out:
        raise PlanError(f"{path}: no container runs vLLM (vllm serve, the api_server module or a vLLM image)")
    return out


def _strs(items: Any) -> list[str] | None:
    return [str(x) for x in items] if isinstance(items, list) else None


def _flags_json(version: str, release: str, checks: list[FlagCheck]) -> dict[str, Any]:
    refused = [c for c in checks if c.refused]
    return {"vllm_version": version, "release_read": release, "accepts_every_flag": not refused,
            "refused": [c.to_json() for c in refused], "notes": [c.to_json() for c in checks if c.note and not c.refused]}


def _flags_text(version: str, release: str, checks: list[FlagCheck]) -> str:
    refused = [c for c in checks if c.refused]
    read = f" (flags of {release}, read from its wheel)" if release != version else " (flags read from its wheel)"
    lines = [f"vLLM {version}{read}: " + (f"{len(refused)} flag(s) it lacks or renamed" if refused
                                          else "it accepts every flag of the manifest")]
    for c in refused:
        lines.append(f"  {c.container}: {c.spelled}: {c.verdict.describe()}" +
                     (f" -> use {c.verdict.renamed_to}" if c.verdict.renamed_to else " -> remove it"))
    for c in checks:
        if c.note and not c.refused:
            lines.append(f"  {c.container}: {c.spelled}: {c.note}")
    return "\n".join(lines)


def cmd_plan(args: argparse.Namespace) -> int:
    try:
        workload = _workload(args.manifest)
        checks: list[FlagCheck] | None = None
        release = ""
        if args.vllm_version is not None:
            release = _release(args.vllm_version)
            checks = check_release(_vllm_commands(workload, args.manifest), args.vllm_version)
        result = plan(workload, _node(args)) if checks is None or args.node or args.gpu else None
    except PlanError as exc:
        print(f"vllm-oncall plan: {exc}", file=sys.stderr)
        return 2
    flags_ok = checks is None or not any(c.refused for c in checks)
    if args.format == "json":
        doc: dict[str, Any] = result.to_json() if result is not None else {}
        if checks is not None:
            doc["flags"] = _flags_json(args.vllm_version, release, checks)
        print(json.dumps(doc, indent=2))
    else:
        parts = ([render(result)] if result is not None else []) + \
            ([_flags_text(args.vllm_version, release, checks)] if checks is not None else [])
        print("\n\n".join(parts))
    return plan_exit_code(flags_ok, result.verdict if result is not None else None)


EXIT_FITS, EXIT_DOES_NOT_FIT, EXIT_BAD_INPUT, EXIT_CANNOT_JUDGE = 0, 1, 2, 3


def plan_exit_code(flags_ok: bool, verdict: str | None) -> int:
    """0 fits, 1 does not fit (or the release lacks a flag), 2 bad input, 3 cannot judge: a script
    must not read "the model's size or the GPU's memory is unknown" as either yes or no."""
    if not flags_ok or verdict == "fails":
        return EXIT_DOES_NOT_FIT
    if verdict == "unknown":
        return EXIT_CANNOT_JUDGE
    return EXIT_FITS

