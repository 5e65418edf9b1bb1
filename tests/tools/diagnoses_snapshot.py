"""Every diagnosis the project can produce offline, as one JSON file, to prove a change to the
log reader or the playbook loader changes no diagnosis (issue 20: byte-identical before/after).

    python tests/tools/diagnoses_snapshot.py OUT.json [extra log files...]   # on the old tree
    python tests/tools/diagnoses_snapshot.py NEW.json [extra log files...]   # on the new tree
    PYTHONPATH=OLD_CHECKOUT python ...   # the old tree without switching branches (git archive main)
    cmp OUT.json NEW.json   # or: python tests/tools/diagnoses_snapshot.py NEW.json --against OUT.json

It runs `vllm-oncall diagnose` (JSON and text) and the log reader alone (every fact, hit line,
head and tail line it kept) in-process on every fixture bundle
(tests/fixtures/bundles, tests/fixtures/realvllm), every bundle of the shared corpus
(../shared/corpus, when present) and any extra log files given (the generated 100 MB/1 GB logs).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUNDLE_ROOTS = (ROOT / "tests/fixtures/bundles", ROOT / "tests/fixtures/realvllm", ROOT.parent / "shared/corpus")


def bundles() -> list[Path]:
    found = []
    for root in BUNDLE_ROOTS:
        if root.is_dir():
            found += sorted(p for p in root.iterdir() if p.is_dir() and (p / "previous.log").is_file())
    return found


def snapshot(logs: list[Path]) -> dict[str, dict[str, str]]:
    from bot.diagnosis.diagnose import diagnose
    from bot.diagnosis.evidence import load_bundle, load_log
    from bot.diagnosis.logfacts import extract
    from bot.diagnosis.playbooks import default_playbooks
    from bot.diagnosis.render import render_text

    literals = [lit for b in default_playbooks() for lit in b.literals()]

    out = {}
    for source in bundles() + logs:
        evidence = load_log(source) if source.is_file() else load_bundle(source)
        result = diagnose(evidence, None)
        out[str(source.relative_to(ROOT.parent) if source.is_relative_to(ROOT.parent) else source)] = {
            "json": json.dumps(result.to_public_json(), indent=2), "text": render_text(result),
            # what the reader kept (facts, stages, errors, hit lines, head, tail): stricter than the diagnosis
            "facts": extract(evidence.log, literals).model_dump_json(indent=1)}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("logs", nargs="*", type=Path)
    parser.add_argument("--against", type=Path, help="an earlier snapshot: exit 1 naming each difference")
    args = parser.parse_args()
    snap = snapshot(args.logs)
    args.out.write_text(json.dumps(snap, indent=1, sort_keys=True), encoding="utf-8")
    print(f"{len(snap)} diagnoses written to {args.out}")
    if args.against is None:
        return 0
    old = json.loads(args.against.read_text(encoding="utf-8"))
    differ = sorted(k for k in set(old) | set(snap) if old.get(k) != snap.get(k))
    for name in differ:
        print(f"differs: {name}")
    print(f"{len(snap) - len(differ)} of {len(set(old) | set(snap))} identical")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
