"""Read and rewrite a vLLM container's command line in every shape real manifests use.

Shapes: `vllm serve MODEL ...` in command or args, image entrypoint with `args` only,
one `/bin/sh -c "..."` string, `python -m vllm.entrypoints.openai.api_server --model X`,
`--flag=value` / `--flag value` / `--flag_with_underscores`, duplicates (last wins, as
argparse does). Rewriting keeps the manifest's own spelling: an edited flag keeps its
`=` or space form and its underscores, a shell string stays one string, and duplicates of
an edited flag collapse to the last one.

Flags can also come from the container's environment: `${VLLM_ARGS}` / `$VLLM_ARGS` unquoted
in a `sh -c` script (the shell splits the value into words), and Kubernetes' own `$(NAME)`
(the kubelet puts the value in place: one word in command/args, re-split by a shell script).
Given the container's env, those flags are read with their values; they are never edited
inside the variable: a new value goes last on the command line, where argparse lets it win.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from bot.diagnosis.models import Change
from bot.support.memo import kept_for_short_texts

SHELLS = {"sh", "bash", "/bin/sh", "/bin/bash", "/usr/bin/bash", "/usr/bin/sh", "dash", "/bin/dash", "zsh"}

# Flags that take no value. A token after one of these is never its value.
BOOLEAN_FLAGS = {
    "--enforce-eager", "--trust-remote-code", "--enable-chunked-prefill", "--enable-prefix-caching",
    "--disable-log-requests", "--disable-log-stats", "--enable-lora", "--enable-auto-tool-choice",
    "--disable-custom-all-reduce", "--enable-sleep-mode", "--disable-sliding-window",
    "--enable-expert-parallel", "--disable-frontend-multiprocessing", "--enable-reasoning",
    "--skip-tokenizer-init", "--enable-log-requests", "--disable-fastapi-docs",
    "--enable-prompt-tokens-details", "--calculate-kv-scales", "--use-v2-block-manager",
    "--disable-async-output-proc", "--enable-server-load-tracking", "--async-scheduling",
    "--disable-uvicorn-access-log", "--return-tokens-as-token-ids", "--enable-force-include-usage",
}
_NUMBER = re.compile(r"^-?\d+(\.\d+)?$")


def _aliases() -> tuple[dict[str, str], dict[str, str]]:
    """(short -> long, long alias -> the flag it spells) as vLLM's parsers declare them, read from
    the wheels (vllm_versions' table): `-tp`, `-asc`, `--device-memory-utilization` (0.32+), ..."""
    from bot.diagnosis.vllm_versions import TABLE

    short, long = {}, {}
    for alias, flag in TABLE().alias_groups().items():
        if alias.startswith("--"):
            long[alias] = flag
        elif re.fullmatch(r"-[A-Za-z]\w*", alias):
            short[alias] = flag
    return short, long


SHORT_ALIASES, LONG_ALIASES = _aliases()
# -O is FlexibleArgumentParser's own rewrite, not a declared alias: --compilation-config up to
# 0.32 (-O3, -O.mode=3), --optimization-level in 0.33. Read as the older meaning, as before.
SHORT_ALIASES.setdefault("-O", "--compilation-config")


# A diagnosis asks ~150 times about the same few flags (issue 20): short flags' answers are kept.
@kept_for_short_texts(max_chars=80, maxsize=1024)
def canonical(flag: str) -> str:
    """`--max_model_len` -> `--max-model-len`; only the part before a `.` (vLLM >= 0.9.1)."""
    if not flag.startswith("--"):
        return flag
    head, dot, rest = flag[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + rest


@kept_for_short_texts(max_chars=80, maxsize=1024)
def primary(flag: str) -> str:
    """The flag an alias spells: `--device-memory-utilization` -> `--gpu-memory-utilization`."""
    name = canonical(flag)
    return LONG_ALIASES.get(name, SHORT_ALIASES.get(name, name))


def same_flag(a: str, b: str) -> bool:
    """Two spellings of one vLLM setting (equal after dashes and aliases)."""
    return primary(a) == primary(b)


_BOOLEAN_PREFIXES = ("--enable-", "--disable-", "--no-", "--use-", "--trust-", "--skip-")


def is_boolean(flag: str) -> bool:
    """Flags that take no value: the known ones, and vLLM's --enable-*/--disable-*/--no-* switches."""
    c = canonical(flag)
    return c in BOOLEAN_FLAGS or c.startswith(_BOOLEAN_PREFIXES)


@dataclass
class Token:
    """One word of the command line and where it sits in the manifest."""

    text: str
    where: str  # "command" | "args" | ENV (a word of an environment variable's value)
    index: int  # index in that list
    span: tuple[int, int] | None = None  # for a shell string: character span inside it
    anchor: Token | None = None  # for a word out of a variable: the script's word that expands it


@dataclass
class FlagUse:
    name: str  # canonical --dash-form
    flag_token: Token
    value_token: Token | None  # for `--flag value`
    inline_value: str | None  # for `--flag=value`
    spelled: str  # the flag exactly as written

    @property
    def from_env(self) -> bool:
        """Read out of an environment variable the command line expands: not editable in place."""
        return self.flag_token.where == ENV

    @property
    def value(self) -> str | None:
        if self.inline_value is not None:
            return self.inline_value
        if self.value_token is not None:
            return self.value_token.text
        return None


@dataclass
class ParsedCommand:
    """The vLLM invocation found in a container, with positions for rewriting."""

    command: list[str] | None
    args: list[str] | None
    entrypoint: str  # "vllm serve" | "api_server" | "image entrypoint" | "unknown"
    model: str | None
    flags: list[FlagUse] = field(default_factory=list)
    shell: tuple[str, int] | None = None  # ("command"|"args", index) of a `sh -c` script
    last_token: Token | None = None  # where a new flag is appended after
    found_vllm: bool = False

    def get(self, flag: str) -> str | None:
        """The effective value (last occurrence wins). Booleans read as "true"/"false"."""
        want = canonical(flag)
        # same_flag(use.name, want) and is_boolean(want), with want's side worked out once
        want_primary, negated = primary(want), "--no-" + want[2:] if is_boolean(want) else None
        value: str | None = None
        for use in self.flags:
            if primary(use.name) == want_primary:
                value = use.value if use.value is not None else "true"
            elif use.name == negated:
                value = "false"
        return value

    def has(self, flag: str) -> bool:
        return self.get(flag) is not None

    def spelled(self, flag: str) -> bool:
        """The command line holds exactly this flag (dash-form), not only an alias of it."""
        want = canonical(flag)
        return any(use.name == want for use in self.flags)

    def argv(self) -> list[str]:
        """The container's command and args as written in the manifest."""
        return list(self.command or []) + list(self.args or [])


OPERATOR = "\x00"  # marks separator and redirection words, so a quoted "&" stays an argument
ENV = "env"  # Token.where of a word that came out of an environment variable's value
# A whole word that is one variable: `${NAME}` or `$NAME` (the shell's), `$(NAME)` (Kubernetes').
_ENV_REFERENCE = re.compile(r"\$\{(\w+)\}|\$(\w+)|\$\((\w+)\)")


def _shell_words(script: str) -> list[tuple[str, tuple[int, int]]]:
    """Split a shell script into words with their character spans.

    Understood: single and double quotes (with backslash escapes inside double quotes),
    backslash-newline continuations, `#` comments, newlines and `;`, `&&`, `||`, `|`, `&` as
    command separators, and redirections (`2>&1`, `> file`), which end a command's words.
    """
    words: list[tuple[str, tuple[int, int]]] = []
    i, n = 0, len(script)
    while i < n:
        ch = script[i]
        if ch == "\\" and i + 1 < n and script[i + 1] == "\n":
            i += 2
        elif ch in " \t":
            i += 1
        elif ch == "#":
            end = script.find("\n", i)
            i = n if end == -1 else end
        else:
            operator = _operator_at(script, i)
            if operator is not None:
                words.append(operator)
                i = operator[1][1]
            else:
                word, end = _read_word(script, i)
                words.append((word, (i, end)))
                i = end
    return words


def _operator_at(script: str, i: int) -> tuple[str, tuple[int, int]] | None:
    """A newline, a redirection or a run of separator characters starting at i, marked OPERATOR."""
    if script[i] == "\n":
        return OPERATOR + "\n", (i, i + 1)
    redirect = re.match(r"\d*(?:>>?|<|&>)(?:&\d+)?", script[i:])
    if redirect:
        return OPERATOR + redirect.group(0), (i, i + redirect.end())
    if script[i] in ";&|":
        j = i
        while j < len(script) and script[j] in ";&|":
            j += 1
        return OPERATOR + script[i:j], (i, j)
    return None


def _read_word(script: str, i: int) -> tuple[str, int]:
    """One shell word starting at i, its quotes and escapes resolved, and where it ends."""
    n, buf = len(script), []
    while i < n and script[i] not in " \t\n;&|<>":
        ch = script[i]
        if ch == "'":
            end = script.find("'", i + 1)
            end = n if end < 0 else end
            buf.append(script[i + 1 : end])
            i = end + 1
        elif ch == '"':
            i += 1
            while i < n and script[i] != '"':
                if script[i] == "\\" and i + 1 < n and script[i + 1] in '"\\$`':
                    buf.append(script[i + 1])
                    i += 2
                else:
                    buf.append(script[i])
                    i += 1
            i += 1
        elif ch == "\\" and i + 1 < n:
            if script[i + 1] != "\n":
                buf.append(script[i + 1])
            i += 2
        else:
            buf.append(ch)
            i += 1
    return "".join(buf), i


def _locate_shell(command: list[str] | None, args: list[str] | None) -> tuple[str, int] | None:
    """Where the script of `sh -c SCRIPT` sits: in command, or as the first arg."""
    cmd = command or []
    if not cmd or cmd[0].rsplit("/", 1)[-1] not in {s.rsplit("/", 1)[-1] for s in SHELLS}:
        return None
    for i, word in enumerate(cmd[1:], start=1):
        if word.startswith("-") and not word.startswith("--") and word.endswith("c"):
            if i + 1 < len(cmd):
                return ("command", i + 1)
            return ("args", 0) if args else None
    return None


def parse(command: list[str] | None, args: list[str] | None, env: dict[str, str] | None = None) -> ParsedCommand:
    """env: the container's literal environment, to read the flags the command line expands."""
    shell = _locate_shell(command, args)
    tokens = _expand_env(_tokens(command, args, shell), command, args, shell, env or {})
    parsed = ParsedCommand(command=command, args=args, entrypoint="unknown", model=None, shell=shell)
    start = _find_vllm_start(tokens, command)
    if start is None:
        return parsed
    begin, entrypoint = start
    parsed.entrypoint = entrypoint
    parsed.found_vllm = True
    i = begin
    positional_model_allowed = entrypoint in {"vllm serve", "image entrypoint"}
    while i < len(tokens):
        tok = tokens[i]
        if _is_operator(tok):
            break
        parsed.last_token = tok.anchor or tok  # new flags go after a word of the manifest, never into a variable
        after = _read_flag(tokens, i, parsed)
        if after is not None:
            i = after
            continue
        if positional_model_allowed and parsed.model is None and not tok.text.startswith("-"):
            parsed.model = tok.text
        i += 1
    if parsed.model is None or parsed.get("--model"):
        parsed.model = parsed.get("--model") or parsed.model
    return parsed


def _tokens(command: list[str] | None, args: list[str] | None, shell: tuple[str, int] | None) -> list[Token]:
    """The words vLLM would see: a `sh -c` script split into words, or command + args as they are."""
    if shell:
        where, idx = shell
        script = ((command or []) if where == "command" else (args or []))[idx]
        return [Token(text, where, idx, span) for text, span in _shell_words(script)]
    return [Token(item, where, i) for where, items in (("command", command), ("args", args))
            for i, item in enumerate(items or [])]


def _expand_env(tokens: list[Token], command: list[str] | None, args: list[str] | None,
                shell: tuple[str, int] | None, env: dict[str, str]) -> list[Token]:
    """The words after the kubelet and the shell put in the variables the container defines.

    In a script only an unquoted word that is exactly one reference is expanded (a quoted one
    stays one word, as the shell keeps it) into its value's words, each anchored to the
    reference word so appended flags still land after it. In command/args `$(NAME)` is the
    kubelet's: the value replaces the word in place, as one word."""
    if not env:
        return tokens
    script = None
    if shell:
        where, idx = shell
        script = ((command or []) if where == "command" else (args or []))[idx]
    expanded: list[Token] = []
    for tok in tokens:
        m = _ENV_REFERENCE.fullmatch(tok.text)
        name = next((g for g in m.groups() if g), None) if m else None
        if name is None or not env.get(name):  # unset, empty, or from a secret or config map (not read)
            expanded.append(tok)
        elif script is None:
            if m and m.group(3):  # only `$(NAME)` is expanded outside a shell
                expanded.append(Token(env[name], tok.where, tok.index, tok.span))
            else:
                expanded.append(tok)
        elif tok.span and script[tok.span[0]:tok.span[1]] == tok.text:  # written unquoted
            expanded.extend(Token(word, ENV, -1, anchor=tok) for word in env[name].split())
        else:
            expanded.append(tok)
    return expanded


def _read_flag(tokens: list[Token], i: int, parsed: ParsedCommand) -> int | None:
    """Record the flag at tokens[i] (with its value, if it takes one) and return the index after
    it; None when tokens[i] is not a flag."""
    tok = tokens[i]
    text = tok.text
    if text.startswith("--") and len(text) > 2:
        name, eq, inline = text.partition("=")
        cname = canonical(name)
        if eq:
            parsed.flags.append(FlagUse(cname, tok, None, inline, name))
            return i + 1
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        takes_value = (
            not is_boolean(cname)
            and nxt is not None
            and (not nxt.text.startswith("-") or _NUMBER.match(nxt.text) is not None)
            and not _is_operator(nxt)
        )
        if takes_value and nxt is not None:
            parsed.flags.append(FlagUse(cname, tok, nxt, None, name))
            parsed.last_token = nxt.anchor or nxt
            return i + 2
        parsed.flags.append(FlagUse(cname, tok, None, None, name))
        return i + 1
    short, eq, inline = text.partition("=")
    if short in SHORT_ALIASES and (eq or i + 1 < len(tokens)):
        if eq:
            parsed.flags.append(FlagUse(SHORT_ALIASES[short], tok, None, inline, short))
            return i + 1
        parsed.flags.append(FlagUse(SHORT_ALIASES[short], tok, tokens[i + 1], None, short))
        parsed.last_token = tokens[i + 1]
        return i + 2
    return None


def _find_vllm_start(tokens: list[Token], command: list[str] | None) -> tuple[int, str] | None:
    """Index of the first word after the vLLM program name, and which entrypoint it is."""
    for i, tok in enumerate(tokens):
        base = tok.text.rsplit("/", 1)[-1]
        nxt = tokens[i + 1].text if i + 1 < len(tokens) else ""
        if base == "vllm" and nxt == "serve":
            return i + 2, "vllm serve"
        if base.startswith("python") and nxt == "-m" and i + 2 < len(tokens):
            module = tokens[i + 2].text
            if module.startswith("vllm.entrypoints"):
                return i + 3, "api_server"
        if tok.text.startswith("vllm.entrypoints") and i > 0 and tokens[i - 1].text == "-m":
            return i + 1, "api_server"
    if not command and tokens:
        # Image ENTRYPOINT runs vLLM (api_server in older images, `vllm serve` in newer ones).
        return 0, "image entrypoint"
    return None


def apply_flag_changes(parsed: ParsedCommand, changes: list[Change]) -> tuple[list[str] | None, list[str] | None]:
    """New (command, args) with each flag change made in the manifest's own spelling.

    Changes are made one after the other, each on the command line the one before left, so a
    removal and a setting of two spellings of one flag (a rename) cannot collide."""
    command = list(parsed.command) if parsed.command is not None else None
    args = list(parsed.args) if parsed.args is not None else None
    current = parsed
    for change in changes:
        if change.kind == "flag":
            command, args = _apply_one(current, change)
            current = parse(command, args)
    return command, args


def _apply_one(parsed: ParsedCommand, change: Change) -> tuple[list[str] | None, list[str] | None]:
    command = list(parsed.command) if parsed.command is not None else None
    args = list(parsed.args) if parsed.args is not None else None
    lists = {"command": command, "args": args}
    edits = _Edits()
    _plan_flag_change(change, parsed, edits)
    if parsed.shell:
        _rewrite_script(parsed, lists, edits)
        return command, args
    return _rewrite_argv(lists, edits)


class _Edits:
    """Word-level edits of argv ((where, index) -> replacement words), character spans of a
    shell script (start, end, text), and flags to append at the end."""

    def __init__(self) -> None:
        self.argv: dict[tuple[str, int], list[str]] = {}
        self.spans: list[tuple[int, int, str]] = []
        self.appended: list[str] = []


def _plan_flag_change(change: Change, parsed: ParsedCommand, edits: _Edits) -> None:
    q = shlex.quote if parsed.shell else (lambda text: text)
    name = canonical(change.name)
    # A removal takes away the spelling it names (the one vLLM refused); a new value goes to the
    # flag however the manifest spells it, aliases included.
    matches = (lambda n: n == name) if change.after is None else (lambda n: same_flag(n, name))
    uses = [u for u in parsed.flags if matches(u.name) or (is_boolean(name) and u.name == "--no-" + name[2:])]
    if uses and uses[-1].from_env:
        # The value vLLM sees comes out of a variable: the variable is left as it is (other flags
        # share it) and the new value goes last; a removal cannot be written this way.
        for use in uses:
            if not use.from_env:
                _remove_use(use, parsed, edits.argv, edits.spans)
        if change.after is not None and not (change.after == "false" and is_boolean(name)):
            edits.appended.extend([name] if is_boolean(name) and change.after == "true" else [name, change.after])
        return
    for use in uses[:-1]:  # duplicates collapse to the last one (a variable's words stay as they are)
        if not use.from_env:
            _remove_use(use, parsed, edits.argv, edits.spans)
    if not uses:
        if change.after is None or (change.after == "false" and is_boolean(name)):
            return
        edits.appended.extend([name] if is_boolean(name) and change.after == "true" else [name, change.after])
        return
    last = uses[-1]
    if change.after is None:
        _remove_use(last, parsed, edits.argv, edits.spans)
    elif is_boolean(name):
        word = name if change.after == "true" else "--no-" + name[2:]
        _replace(last.flag_token, word, parsed, edits.argv, edits.spans)
    elif last.inline_value is not None:
        _replace(last.flag_token, f"{last.spelled}={q(change.after)}", parsed, edits.argv, edits.spans)
    elif last.value_token is not None:
        _replace(last.value_token, q(change.after), parsed, edits.argv, edits.spans)
    elif parsed.shell:
        _replace(last.flag_token, f"{last.spelled} {q(change.after)}", parsed, edits.argv, edits.spans)
    else:
        edits.argv[(last.flag_token.where, last.flag_token.index)] = [last.spelled, change.after]


def _rewrite_script(parsed: ParsedCommand, lists: dict[str, list[str] | None], edits: _Edits) -> None:
    assert parsed.shell is not None
    where, idx = parsed.shell
    target = lists[where]
    assert target is not None
    script = target[idx]
    spans = list(edits.spans)
    if edits.appended and parsed.last_token and parsed.last_token.span:
        end = parsed.last_token.span[1]
        spans.append((end, end, " " + " ".join(shlex.quote(a) for a in edits.appended)))
    for start, end, text in sorted(spans, key=lambda e: (e[0], e[1]), reverse=True):
        # a removal swallows the blank before it so no double spaces remain
        if text == "" and start > 0 and script[start - 1] == " ":
            start -= 1
        script = script[:start] + text + script[end:]
    target[idx] = script


def _rewrite_argv(lists: dict[str, list[str] | None], edits: _Edits) -> tuple[list[str] | None, list[str] | None]:
    for where in ("command", "args"):
        items = lists[where]
        if items is None:
            continue
        rebuilt: list[str] = []
        for i, item in enumerate(items):
            rebuilt.extend(edits.argv.get((where, i), [item]))
        lists[where] = rebuilt
    command, args = lists["command"], lists["args"]
    if edits.appended:
        if args is not None or command is None:
            args = (args or []) + edits.appended
        else:
            command = command + edits.appended
    return command, args


def _replace(tok: Token, text: str, parsed: ParsedCommand, argv_edits: dict, span_edits: list) -> None:
    """`text` is final: already quoted for the shell by the caller when the command is a script."""
    if parsed.shell and tok.span:
        span_edits.append((tok.span[0], tok.span[1], text))
    else:
        argv_edits[(tok.where, tok.index)] = [text]


def _is_operator(tok: Token) -> bool:
    """A separator word the tokenizer made (not a quoted argument that happens to read `&`)."""
    return tok.text.startswith(OPERATOR)


def _remove_use(use: FlagUse, parsed: ParsedCommand, argv_edits: dict, span_edits: list) -> None:
    for tok in (use.flag_token, use.value_token):
        if tok is None:
            continue
        if parsed.shell and tok.span:
            span_edits.append((tok.span[0], tok.span[1], ""))
        else:
            argv_edits[(tok.where, tok.index)] = []
