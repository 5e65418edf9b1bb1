"""`vllm-oncall plan`'s arguments. Apart from bot.cli.plan so that building the parser (every
command, `--help` included) does not import the planner, the flag tables and the command-line
parser: only `plan` itself pays for them (issue 20)."""

from __future__ import annotations

import argparse


def cmd_plan(args: argparse.Namespace) -> int:
    from bot.cli import long_lived_imports

    with long_lived_imports():
        from bot.cli.plan import cmd_plan as run

    return run(args)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="before deploying: does a manifest fit its GPUs, which stage fails first, "
                                    "what to change (exit 0 fits, 1 does not, 2 bad input, 3 cannot judge)")
    p.add_argument("manifest", help="a Deployment, StatefulSet or Pod manifest file")
    p.add_argument("--node", metavar="NODE.yaml", help="the node it will run on (kubectl get node NAME -o yaml)")
    p.add_argument("--gpu", metavar="PRODUCT", help="or a GPU product, e.g. NVIDIA-H100-80GB-HBM3, NVIDIA-L40S")
    p.add_argument("--gpus", type=int, default=1, help="GPUs on that node with --gpu (default 1)")
    p.add_argument("--vllm-version", metavar="X", help="the vLLM release to run, e.g. 0.33: say which flags of the "
                                                         "manifest it lacks or renamed (exit 1 when any)")
    p.add_argument("--format", choices=["text", "json"], default="text")
    p.set_defaults(func=cmd_plan)
