"""`vllm-oncall plan`: the memory model before a crash, for CI and pre-deploy checks.

    vllm-oncall plan deploy.yaml --node node.yaml
    vllm-oncall plan deploy.yaml --gpu NVIDIA-H100-80GB-HBM3 --gpus 8 --format json

Exit status: 0 the workload fits, 1 it does not (or cannot be judged), 2 bad input (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from bot.diagnosis.preflight import PlanError, gpu_node, plan, render


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


def cmd_plan(args: argparse.Namespace) -> int:
    try:
        result = plan(_workload(args.manifest), _node(args))
    except PlanError as exc:
        print(f"vllm-oncall plan: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result.to_json(), indent=2) if args.format == "json" else render(result))
    return 0 if result.fits else 1


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="before deploying: does a manifest fit its GPUs, which stage fails first, "
                                    "what to change (exit 0 fits, 1 does not, 2 bad input)")
    p.add_argument("manifest", help="a Deployment, StatefulSet or Pod manifest file")
    p.add_argument("--node", metavar="NODE.yaml", help="the node it will run on (kubectl get node NAME -o yaml)")
    p.add_argument("--gpu", metavar="PRODUCT", help="or a GPU product, e.g. NVIDIA-H100-80GB-HBM3, NVIDIA-L40S")
    p.add_argument("--gpus", type=int, default=1, help="GPUs on that node with --gpu (default 1)")
    p.add_argument("--format", choices=["text", "json"], default="text")
    p.set_defaults(func=cmd_plan)
