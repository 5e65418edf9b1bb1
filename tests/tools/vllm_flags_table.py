"""Regenerate bot/diagnosis/data/vllm_flag_history.yaml: the flags of each vLLM release, read
from each wheel's own source (never imported). The same document is written as JSON beside it
(vllm_flag_history.json, what the bot parses on every start: issue 20).

    python tests/tools/vllm_flags_table.py                 # download, read, write the table
    python tests/tools/vllm_flags_table.py --src /tmp/src  # reuse trees unpacked before (DIR/X/vllm)
    python tests/tools/vllm_flags_table.py --add 0.34.0    # one more release

For each release: `pip download vllm==X --no-deps`, `unzip` only the argument-parser files,
delete the wheel, then read with `ast`:

- every `add_argument("--flag", "--alias", "-x", ...)` call in vllm/engine/arg_utils.py
  (EngineArgs.add_cli_args and AsyncEngineArgs.add_cli_args), in the module that defines the
  server's `make_arg_parser` (vllm/entrypoints/openai/cli_args.py, later
  entrypoints/launchers/ or entrypoints/common/cli_args.py) and in vllm/entrypoints/cli/serve.py;
- the flags generated from dataclass fields (`FrontendArgs.add_cli_args` adds
  `--{field.replace('_', '-')}` for every field of the class and its bases, plus the
  `["flags"]` extras its `_customize_cli_kwargs` sets), as vLLM 0.9+ derives them;
- in releases whose FlexibleArgumentParser registers `EnableDisableAction` for
  `BooleanOptionalAction` (0.33+), every boolean `--enable-x` also accepts `--disable-x` (and
  the reverse), as that class's `_inverse_prefixes` does; `--no-x` is left to the reader;
- deprecations: `deprecated=True`, a help text saying "deprecated", or a message in the same
  file saying "--flag is deprecated".

A flag's rename is found, not written by hand: the flag removed in release N is renamed to the
flag that in release N has the dest (the config field) it had, or that shared its action as
an alias. The table keeps ranges of the releases read; `bot.diagnosis.vllm_versions` maps any
0.6-0.33 version onto them.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "bot" / "diagnosis" / "data" / "vllm_flag_history.yaml"

# Each minor's latest patch, plus 0.6.0 and 0.14.0 (the first release and the patch before
# --disable-log-requests was deprecated).
RELEASES = ["0.6.0", "0.6.6.post1", "0.7.3", "0.8.5.post1", "0.9.2", "0.10.0", "0.10.2", "0.11.2", "0.12.0", "0.13.0",
            "0.14.0", "0.14.1", "0.15.1", "0.16.0", "0.17.1", "0.18.1", "0.19.1", "0.20.2", "0.21.0", "0.22.1",
            "0.23.0", "0.24.0", "0.25.1", "0.26.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0",
            "0.33.0"]
PARTS = ["vllm/engine/*", "vllm/entrypoints/*", "vllm/config*", "vllm/utils*", "vllm/version.py", "vllm/_version.py"]


def version_key(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text.replace(".post", ".")))


# ---- getting the source ----------------------------------------------------------------------


def unpack(version: str, into: Path) -> Path:
    """vllm==version's parser files under into/version/vllm (the wheel deleted after)."""
    tree = into / version
    if (tree / "vllm").is_dir():
        return tree
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", f"vllm=={version}", "--no-deps", "-q", "-d", tmp],
                       check=True)
        wheel = next(Path(tmp).glob("*.whl"))
        tree.mkdir(parents=True, exist_ok=True)
        # unzip exits 11 when a pattern matches nothing (older wheels lack some parts)
        subprocess.run(["unzip", "-q", "-o", str(wheel), *PARTS, "-d", str(tree)], check=False)
    return tree


# ---- reading one release ---------------------------------------------------------------------


@dataclass
class Action:
    """One argparse action: its option strings, where its value goes, how it reads."""

    options: list[str]
    dest: str
    boolean_optional: bool = False
    deprecated: bool = False


@dataclass
class Release:
    version: str
    actions: list[Action] = field(default_factory=list)
    inverses: dict[str, str] = field(default_factory=dict)  # --disable-x -> --enable-x (0.33+)

    def flags(self) -> dict[str, Action]:
        return {o: a for a in self.actions for o in a.options if o.startswith("--")}


def _const_str(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):  # f"..." help texts: the literal parts
        return "".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _const_str(node.left), _const_str(node.right)
        return (left or "") + (right or "") if left is not None or right is not None else None
    return None


def _is_bool_optional(node: ast.AST) -> bool:
    return isinstance(node, (ast.Attribute, ast.Name)) and ast.unparse(node).endswith("BooleanOptionalAction")


def _field_types(trees: list[ast.Module]) -> dict[str, str]:
    """field name -> annotation text, EngineArgs first (the kwargs' fields mostly share its names)."""
    types: dict[str, str] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        types.setdefault(item.target.id, ast.unparse(item.annotation))
    return types


def _is_bool_type(annotation: str | None) -> bool:
    """get_kwargs gives BooleanOptionalAction to a field whose type holds bool but not str."""
    return bool(annotation) and re.search(r"\bbool\b", annotation or "") is not None and "str" not in (annotation or "")


def _add_argument_actions(tree: ast.Module, types: dict[str, str]) -> list[Action]:
    actions = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"):
            continue
        options = [s for s in (_const_str(a) for a in node.args) if s and re.fullmatch(r"--?[A-Za-z][\w.-]*", s)]
        if not any(o.startswith("--") for o in options):
            continue
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        spread = [k.value for k in node.keywords if k.arg is None]
        field_name = None
        while spread:  # **model_kwargs["max_model_len"], or **{**cache_kwargs["x"], "default": None}
            value = spread.pop(0)
            if isinstance(value, ast.Subscript):
                field_name = _const_str(value.slice)
            elif isinstance(value, ast.Dict):
                spread.extend(v for k, v in zip(value.keys, value.values) if k is None)
        dest_node = keywords.get("dest")
        first_long = next(o for o in options if o.startswith("--"))
        dest = (_const_str(dest_node) if dest_node is not None else None) or field_name or first_long[2:].replace("-", "_")
        boolean = _is_bool_optional(keywords["action"]) if "action" in keywords else (
            field_name is not None and _is_bool_type(types.get(field_name)))
        deprecated_node = keywords.get("deprecated")
        help_text = (_const_str(keywords["help"]) if "help" in keywords else "") or ""
        deprecated = (isinstance(deprecated_node, ast.Constant) and deprecated_node.value is True) or \
            "deprecated" in help_text.lower()
        actions.append(Action(options, dest, boolean, deprecated))
    return actions


def _generated_actions(tree: ast.Module, types: dict[str, str]) -> list[Action]:
    """Flags a class's add_cli_args generates from its dataclass fields (FrontendArgs, 0.9+)."""
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}

    def generates(cls: ast.ClassDef) -> bool:
        return any(isinstance(n, ast.JoinedStr) and len(n.values) == 2 and _const_str(n.values[0]) == "--"
                   and isinstance(n.values[1], ast.FormattedValue) for n in ast.walk(cls))

    def fields(cls: ast.ClassDef) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for base in cls.bases:
            if isinstance(base, ast.Name) and base.id in classes:
                out.extend(fields(classes[base.id]))
        for item in cls.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and \
                    not item.target.id.startswith("_") and "ClassVar" not in ast.unparse(item.annotation):
                out.append((item.target.id, ast.unparse(item.annotation)))
        return out

    used = set()
    for node in ast.walk(tree):  # FrontendArgs.add_cli_args(parser) inside make_arg_parser
        if isinstance(node, ast.FunctionDef) and node.name == "make_arg_parser":
            for call in ast.walk(node):
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and \
                        call.func.attr == "add_cli_args" and isinstance(call.func.value, ast.Name):
                    used.add(call.func.value.id)
    actions = []
    for name in used:
        cls = classes.get(name)
        if cls is None or not (generates(cls) or any(generates(classes[b.id]) for b in cls.bases
                                                      if isinstance(b, ast.Name) and b.id in classes)):
            continue
        extras, removed = _customized(cls, classes)
        for fname, annotation in dict(fields(cls)).items():
            if fname in removed:
                continue
            options = [*extras.get(fname, []), "--" + fname.replace("_", "-")]
            actions.append(Action(options, fname, _is_bool_type(annotation)))
    return actions


def _customized(cls: ast.ClassDef, classes: dict[str, ast.ClassDef]) -> tuple[dict[str, list[str]], set[str]]:
    """`kwargs["field"]["flags"] = ["-x"]` extras and `del kwargs["field"]` removals in the class
    (and its bases) _customize_cli_kwargs / add_cli_args."""
    extras: dict[str, list[str]] = {}
    removed: set[str] = set()
    nodes = [cls] + [classes[b.id] for b in cls.bases if isinstance(b, ast.Name) and b.id in classes]
    for owner in nodes:
        for node in ast.walk(owner):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Subscript) and _const_str(target.slice) == "flags" and \
                        isinstance(target.value, ast.Subscript) and isinstance(node.value, (ast.List, ast.Tuple)):
                    key = _const_str(target.value.slice)
                    if key:
                        extras[key] = [s for s in (_const_str(e) for e in node.value.elts) if s]
            if isinstance(node, ast.Delete):
                for target in node.targets:
                    if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
                        key = _const_str(target.slice)
                        if key:
                            removed.add(key)
    return extras, removed


def _server_module(vllm: Path) -> Path | None:
    for candidate in ("entrypoints/openai/cli_args.py", "entrypoints/launchers/cli_args.py",
                      "entrypoints/common/cli_args.py"):
        path = vllm / candidate
        if path.is_file() and "def make_arg_parser" in path.read_text(encoding="utf-8"):
            return path
    return None


_DEPRECATED_MESSAGE = re.compile(r"(--[a-z0-9][a-z0-9-]*)[^.\n]{0,40}?\bis deprecated\b", re.I)


def read_release(version: str, tree: Path) -> Release:
    vllm = tree / "vllm"
    files = [vllm / "engine" / "arg_utils.py", _server_module(vllm), vllm / "entrypoints" / "cli" / "serve.py"]
    modules = [ast.parse(p.read_text(encoding="utf-8")) for p in files if p is not None and p.is_file()]
    config_trees = [ast.parse(p.read_text(encoding="utf-8")) for p in sorted((vllm / "config").glob("*.py"))] \
        if (vllm / "config").is_dir() else []
    if (vllm / "config.py").is_file():
        config_trees.append(ast.parse((vllm / "config.py").read_text(encoding="utf-8")))
    types = _field_types(modules + config_trees)
    release = Release(version)
    deprecated_by_message: set[str] = set()
    for module in modules:
        release.actions.extend(_add_argument_actions(module, types))
        release.actions.extend(_generated_actions(module, types))
        for node in ast.walk(module):
            text = _const_str(node) if isinstance(node, (ast.Constant, ast.JoinedStr)) else None
            deprecated_by_message.update(m.group(1) for m in _DEPRECATED_MESSAGE.finditer(text or ""))
    for action in release.actions:
        if any(o in deprecated_by_message for o in action.options):
            action.deprecated = True
    parser_utils = "".join(p.read_text(encoding="utf-8") for p in
                           [vllm / "utils" / "argparse_utils.py", vllm / "utils" / "__init__.py", vllm / "utils.py"]
                           if p.is_file())
    if "class EnableDisableAction" in parser_utils:
        taken = release.flags()
        for action in release.actions:
            if not action.boolean_optional:
                continue
            for option in list(action.options):
                for prefix, inverse in (("--enable-", "--disable-"), ("--disable-", "--enable-")):
                    if option.startswith(prefix):
                        twin = inverse + option.removeprefix(prefix)
                        if twin not in taken:
                            release.inverses[twin] = option
    return release


# ---- the table -------------------------------------------------------------------------------


def _ranges(present: list[bool], releases: list[str]) -> list[str]:
    out, start = [], None
    for i, here in enumerate(present + [False]):
        if here and start is None:
            start = i
        elif not here and start is not None:
            first, last = releases[start], releases[i - 1]
            out.append(first if first == last else f"{first}..{last}")
            start = None
    return out


def build_table(releases: list[Release]) -> dict:
    names = [r.version for r in releases]
    per = [r.flags() for r in releases]
    all_flags = sorted({f for flags in per for f in flags} | {f for r in releases for f in r.inverses})
    table: dict[str, dict] = {}
    for flag in all_flags:
        present = [flag in flags or flag in r.inverses for flags, r in zip(per, releases)]
        entry: dict = {"in": _ranges(present, names)}
        deprecated = next((names[i] for i, flags in enumerate(per) if flag in flags and flags[flag].deprecated), None)
        if deprecated:
            entry["deprecated"] = deprecated
        latest = next((flags[flag] for flags in reversed(per) if flag in flags), None)
        if latest is not None:
            long_options = [o for o in latest.options if o.startswith("--")]
            if long_options[0] != flag:
                entry["alias_of"] = long_options[0]
            shorts = [o for o in latest.options if not o.startswith("--")]
            others = [o for o in long_options[1:] if o != flag] if long_options[0] == flag else []
            if shorts or others:
                entry["aliases"] = others + shorts
            if latest.boolean_optional:
                entry["boolean"] = True
        inverse = next((r.inverses[flag] for r in reversed(releases) if flag in r.inverses), None)
        if inverse:
            entry["inverse_of"] = inverse
            entry["inverse_in"] = _ranges([flag in r.inverses and flag not in flags for flags, r in zip(per, releases)],
                                          names)
        for i in range(1, len(releases)):
            if present[i - 1] and not present[i]:
                old = per[i - 1].get(flag)
                renamed = _renamed(flag, old, per[i]) if old else None
                entry.setdefault("removed", []).append({"in": names[i], **({"renamed_to": renamed} if renamed else {})})
        table[flag] = entry
    return {"releases": names, "flags": table}


def _renamed(flag: str, old: Action, now: dict[str, Action]) -> str | None:
    """The flag that, once `flag` is gone, takes the same value: its alias, or one with its dest."""
    for option in old.options:
        if option != flag and option.startswith("--") and option in now:
            return option
    same_dest = sorted({o for o, a in now.items() if a.dest == old.dest and o.startswith("--")})
    return same_dest[0] if same_dest else None


HEADER = """\
# GENERATED by tests/tools/vllm_flags_table.py from each vLLM wheel's own argument parser
# (vllm/engine/arg_utils.py, the server's cli_args.py, entrypoints/cli/serve.py); do not edit.
# releases: the releases read (each minor's latest patch, plus 0.6.0 and 0.14.0).
# flags: `in` the releases that accept the flag (ranges of releases read), `deprecated` the
# first release read that marks it deprecated, `removed` the first release read without it
# (`renamed_to` the flag that took its value), `alias_of` / `aliases` other spellings of the
# same action, `inverse_of` the boolean whose --enable-/--disable- twin it is (0.33+), in the
# releases `inverse_in` (where it is accepted only as that twin),
# `boolean` a BooleanOptionalAction (also accepts --no-FLAG).
"""


def write_json(table: dict, out: Path) -> None:
    """The form the bot reads: the same document as JSON, keys in the YAML's order."""
    out.write_text(json.dumps(table, indent=0) + "\n", encoding="utf-8")  # a line per item: readable diffs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, help="folder of unpacked trees (DIR/X/vllm); kept")
    ap.add_argument("--add", action="append", default=[], help="another release to read")
    ap.add_argument("--out", type=Path, default=TABLE)
    args = ap.parse_args(argv)
    versions = sorted(set(RELEASES) | set(args.add), key=version_key)
    workdir = args.src or Path(tempfile.mkdtemp(prefix="vllm-src-"))
    try:
        releases = [read_release(v, unpack(v, workdir)) for v in versions]
    finally:
        if args.src is None:
            shutil.rmtree(workdir, ignore_errors=True)
    table = build_table(releases)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(HEADER + yaml.safe_dump(table, sort_keys=False, width=120), encoding="utf-8")
    write_json(table, args.out.with_suffix(".json"))
    print(f"{args.out}: {len(table['flags'])} flags over {len(versions)} releases")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
