"""Remove secrets from text before it leaves the bot (chat message, Event, annotation, incident
object, LLM prompt), and from a container's command line and environment.

Pure: no I/O. Three kinds of rule:

- token formats that are secrets wherever they appear (AWS key ids, JWTs, Google API keys,
  Slack, Hugging Face, OpenAI, GitHub and GitLab tokens, PEM private keys). The regexes are
  adapted from gitleaks' default rules (config/gitleaks.toml, MIT licence, Copyright (c) 2019
  Zachary Rice), loosened where gitleaks insists on an exact length to avoid false alarms in
  source code: for redaction a slightly wider match is the safe side.
- `name=value` / `name: value` / `"name": "value"` / `--name value` where the name is
  secret-like (`*_TOKEN`, `*_KEY`, `*PASSWORD*`, `*SECRET*`, `api_key`, `x-api-key`, ...), the
  `Authorization` header, and the password in a URL's userinfo. The value goes, the name stays,
  so the reader still sees *which* setting was there.
- patterns the operator configures (`Redactor(extra_patterns)`).

Deliberately not redacted: empty values (`None`, `null`, `''`, booleans), references such as
`$HF_TOKEN`, and small numbers after token-count names (`max_prompt_adapter_token=0`): they are
vLLM's ordinary start-up lines, and hiding them would hide the evidence.
"""

from __future__ import annotations

import base64
import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

MASK = "***"


class RedactionPatternError(ValueError):
    """A configured redaction pattern that cannot be used; the message names it."""


@dataclass(frozen=True)
class Rule:
    name: str
    regex: str
    replacement: str
    flags: int = 0

    @functools.cached_property
    def pattern(self) -> re.Pattern[str]:
        """Compiled when a text first holds the rule's literal: a text holds few of them, and
        compiling all the token rules (and the literal scan only the fallback uses) took 2 of the
        module's 9 ms import, at every `diagnose` (issue 20)."""
        return re.compile(self.regex, self.flags)


def _rule(name: str, regex: str, replacement: str, flags: int = 0) -> Rule:
    return Rule(name, regex, replacement, flags)


# Tokens that are secrets wherever they appear (adapted from gitleaks, see the module docstring).
TOKEN_RULES: tuple[Rule, ...] = (
    # a known token prefix at a line's end, continued on the next line (a wrapped paste), first: the
    # rules below would mask the first half alone and leave the second
    _rule("split-token",
          r"\b(?:hf_|sk-|gh[pousr]_|github_pat_|glpat-|glrt-|xox[abposre]-|nvapi-|r8_|[sr]k_live_|ya29\.|AKIA|eyJ)"
          r"[\w.-]*[ \t]*\r?\n[ \t]*[\w.-]{4,}(?=[ \t]*(?:\r?\n|$))", "***"),
    _rule("pem-private-key",
          r"-----BEGIN[ A-Z0-9_-]{0,100}PRIVATE KEY(?: BLOCK)?-----"
          r"(?:[\s\S]*?-----END[ A-Z0-9_-]{0,100}PRIVATE KEY(?: BLOCK)?-----|.*)",
          "-----BEGIN PRIVATE KEY----- *** -----END PRIVATE KEY-----"),
    _rule("pem-body-line", r"^[ \t]*(?=[A-Za-z0-9+/]*[A-Z])(?=[A-Za-z0-9+/]*[a-z])[A-Za-z0-9+/]{60,76}={0,2}[ \t]*$",
          MASK, re.MULTILINE),
    _rule("jwt", r"\bey[A-Za-z0-9_-]{10,}\.ey[A-Za-z0-9_/\\-]{10,}\.[A-Za-z0-9_/\\-]*={0,2}", "eyJ***"),
    _rule("aws-access-key-id", r"\b(?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}\b", "AKIA***"),
    _rule("gcp-api-key", r"\bAIza[\w-]{35}", "AIza***"),
    _rule("huggingface-token", r"\bhf_[A-Za-z0-9]{20,}", "hf_***"),
    _rule("openai-key", r"\bsk-(?:proj-|svcacct-|admin-|ant-)?[A-Za-z0-9_-]{16,}", "sk-***"),
    _rule("slack-webhook", r"\bhooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9+/_-]{20,}",
          "hooks.slack.com/***"),
    _rule("slack-token", r"\bxox[abposre]-[A-Za-z0-9-]{10,}", "xox*-***"),
    _rule("slack-app-token", r"\bxapp-\d-[A-Za-z0-9-]{10,}", "xapp-***"),
    _rule("github-token", r"\bgh[pousr]_[A-Za-z0-9]{20,}", "gh*_***"),
    _rule("github-fine-grained-pat", r"\bgithub_pat_\w{22,}", "github_pat_***"),
    _rule("gitlab-token", r"\bgl(?:pat|rt|ptt|dt|cbt|imt|oas|ft|soat|agent)-[\w-]{20,}", "gl*-***"),
    _rule("ngc-api-key", r"\bnvapi-[\w-]{20,}", "nvapi-***"),
    _rule("google-oauth-token", r"\bya29\.[\w-]{20,}", "ya29.***"),
    _rule("stripe-key", r"\b[sr]k_(?:live|test)_[A-Za-z0-9]{16,}", "sk_live_***"),
    _rule("replicate-token", r"\br8_[A-Za-z0-9]{20,}", "r8_***"),
    _rule("wandb-login", r"(?i)\b(wandb\s+login\s+(?:--?[\w-]+\s+)*)[A-Za-z0-9_]{20,}", r"\1***"),
    # mysql/mariadb clients take the password glued to -p (`-pS3cret`), in logs and `sh -c` scripts
    _rule("mysql-password", r"\b((?:mysql|mysqldump|mysqladmin|mariadb|mariadb-dump)\b[^\n;&|]*?\s-p)(?=[^\s])[^\s;&|]+",
          r"\1***"),
    _rule("azure-sas-signature", r"(?i)([?&;]sig=)[A-Za-z0-9%+/=_-]{8,}", r"\1***"),
    # a bare AWS secret access key: 40 base64 characters with upper, lower and a digit or / or +
    # (hex digests are lower-case only, so they stay)
    _rule("aws-secret-key",
          r"(?<![A-Za-z0-9/+=])(?=[A-Za-z0-9/+]{0,39}[A-Z])(?=[A-Za-z0-9/+]{0,39}[a-z])"
          r"(?=[A-Za-z0-9/+]{0,39}[0-9/+])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])", "***"),
)

# `Authorization: Bearer x`, `authorization='Basic x'`: the scheme stays, the credentials go.
_AUTHORIZATION = re.compile(
    r"(?i)\b((?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?)"
    r"(?:(bearer|basic|token|digest|negotiate|apikey)\s+)?[^\s\"',;)}\]]+")
_BEARER = re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]{8,}")
# `Cookie: a=b; c=d`, `Set-Cookie: session=...`: the whole header value goes
_COOKIE = re.compile(r"(?i)\b((?:set-)?cookie[\"']?\s*[:=]\s*[\"']?)[^\s\"'][^\n\"']*")
# scheme://user:password@host -> scheme://user:***@host
# (an empty user, `redis://:pw@host`, and a password holding `@`: up to the last @ before the host)
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s:/@'\"]*:)[^\s/'\"]+@(?=[^\s@/'\"]*(?:[/:?#'\"\s]|$))")
_VALUE = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|\[[^\]\n]*\]|(?:[^\s,;)}\]'\":]|:(?!\s|$))+")
# name=value, name: value, 'name': 'value', "name": "value", name := value (the name and separator;
# the value is read only after a secret-like name, so `headers: x-api-key: v` still finds x-api-key).
# The same matches as without the leading lookahead and the possessive `{0,80}+` and `\s*+`: a
# shorter name or space is followed by a name or space character, never by the quote or separator,
# so giving some back never found a match; it only cost a retry per character, at every word of
# every text (the lookahead skips the positions no name or quote starts at). 0.42 -> 0.27 ms on the
# bench's 8.6 KB log, which the evidence cache redacts at every new alert (issue 20).
_ASSIGNMENT = re.compile(r"(?=[\"'A-Za-z_])(?P<q>[\"']?)(?P<name>\b[A-Za-z_][A-Za-z0-9_.-]{0,80}+)(?P=q)"
                         r"(?P<sep>\s*+(?::=|=|:)\s*)")
# --flag value, --flag=value (a command line inside a log line or a `sh -c` script)
_FLAG = re.compile(r"(?P<name>--[A-Za-z0-9][A-Za-z0-9_-]{0,80})(?P<sep>=|[ \t]+)")

_EMPTY_VALUES = {"", "none", "null", "nil", "true", "false", "''", '""', "[]", "{}", "<none>", "***"}
_SECRET_WORDS = ("password", "passwd", "secret")
_SECRET_LAST = {"token", "key", "secret", "password", "passwd", "pwd", "apikey", "credentials", "credential",
                "pat", "pass", "pw", "creds", "cred", "sas", "auth", "dsn", "sig", "signature", "cookie"}
# `REDIS_URL`, `DATABASE_URI`: a connection string, which carries its password
_CONNECTION_HOSTS = {"redis", "database", "db", "postgres", "postgresql", "pg", "mysql", "mariadb", "mongo", "mongodb",
                     "amqp", "rabbitmq", "broker", "celery", "sqlalchemy", "cache", "valkey", "memcached"}
_SECRET_PAIRS = {("api", "key"), ("access", "key"), ("private", "key"), ("secret", "key"), ("auth", "token"),
                 ("client", "secret"), ("session", "token")}


def name_parts(name: str) -> list[str]:
    """`HF_TOKEN`, `hf-token`, `--hf-token`, `hfToken`, `x.api.key` -> lower-case words."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name.lstrip("-"))
    return [p for p in re.split(r"[_.\-\s]+", spaced.lower()) if p]


@functools.lru_cache(maxsize=4096)  # a log repeats the same few hundred names; bounded
def is_secret_name(name: str) -> bool:
    """Whether a setting of this name holds a secret: `*_TOKEN`, `*_KEY`, `*PASSWORD*`,
    `*SECRET*`, `api_key`, `x-api-key`, `--hf-token`, `--token`. Not `tokenizer`,
    `max_num_batched_tokens` or `kv_cache_dtype`."""
    parts = name_parts(name)
    if not parts:
        return False
    joined = "".join(parts)
    if any(word in joined for word in _SECRET_WORDS):
        return True
    if parts[-1] == "key":
        return len(parts) >= 2  # FOO_KEY, api-key; a bare `key` is too common in logs
    if parts[-1] in _SECRET_LAST or "apikey" in parts:
        return True
    if parts[-1] in ("url", "uri") and any(p in _CONNECTION_HOSTS for p in parts[:-1]):
        return True
    return any(pair in _SECRET_PAIRS for pair in zip(parts, parts[1:]))


def _keeps_value(name: str, value: str) -> bool:
    """Values that are not secrets even under a secret-like name (see the module docstring)."""
    bare = value.strip("'\"[] ").lower()
    if bare in _EMPTY_VALUES or value.strip().lower() in _EMPTY_VALUES:
        return True
    if value.lstrip("'\"").startswith("$"):
        return True  # a reference to a variable, not the secret itself
    # argparse's usage line, which vLLM prints when it refuses a flag: `[--api-key API_KEY]`
    # (the metavar is the flag's own name) and `[--allow-credentials | --no-allow-credentials]`
    if value == "|" or value == "_".join(name_parts(name)).upper():
        return True
    # `max_prompt_adapter_token=0`, `128 KiB/token = 4.00 GiB`: a count or a size, not a token
    return name_parts(name)[-1:] == ["token"] and re.fullmatch(r"\d{1,9}(?:\.\d{1,4})?", bare) is not None


def _masked(value: str) -> str:
    """Keep the value's quoting or list brackets, so the line still reads as it did."""
    if value[:1] in "'\"" and value[-1:] == value[:1] and len(value) >= 2:
        return value[0] + MASK + value[0]
    if value.startswith("["):
        return f"['{MASK}']"
    return MASK


def _mask_values(text: str, names: re.Pattern[str]) -> str:
    """Mask the value after every secret-like name that `names` finds."""
    # The names first, at C speed (findall: the same matches finditer gives): most texts name no
    # secret-like setting, and then nothing below would mask anything. The loop costs ~1 us a match,
    # and a 9 KB vLLM log holds ~170 (issue 20).
    name_group = names.groupindex["name"] - 1
    if not any(_masks_value(name) for name in {found[name_group] for found in names.findall(text)}):
        return text
    out: list[str] = []
    done = 0
    for match in names.finditer(text):
        if match.start() < done:
            continue  # inside a value already masked
        name = match.group("name")
        if not _masks_value(name):
            continue
        value = _VALUE.match(text, match.end())
        if value is None or _keeps_value(name, value.group(0)):
            continue
        out.append(text[done:match.end()] + _masked(value.group(0)))
        done = value.end()
    return "".join(out) + text[done:]


def _masks_value(name: str) -> bool:
    """Whether `_mask_values` masks the value after this name (the Authorization header has its own rule)."""
    return name.lower() not in ("authorization", "proxy-authorization") and is_secret_name(name)


def _authorization(match: re.Match[str]) -> str:
    scheme = match.group(2)
    if match.group(0)[len(match.group(1)):].strip().lower() in _EMPTY_VALUES:
        return match.group(0)
    return f"{match.group(1)}{scheme + ' ' if scheme else ''}{MASK}"


# The prefilter. Every rule below that a literal names can only match where one of its literals
# occurs, so one combined scan over the text finds which rules can match at all, and only those
# run (in the same order as without the prefilter, so the output is identical). Rules without a
# literal (the character-class ones: assignments, flags, base64) always run; PEM body lines and bare
# AWS secrets run where the text holds a long enough run of base64 characters (`_RUN_NEEDED`). A literal is a necessary condition, never a sufficient one: a wider literal only
# costs time. Case-sensitive rules' literals are matched as written; the case-insensitive rules'
# literals (lower case) against the lower-cased text, with the characters that Python's IGNORECASE
# also matches to an ASCII letter (U+017F long s, U+0130/U+0131 dotted/dotless i) folded first.
_XOX = tuple(f"xox{c}-" for c in "abposre")
_GH = tuple(f"gh{c}_" for c in "pousr")
_GL = tuple(f"gl{k}-" for k in ("pat", "rt", "ptt", "dt", "cbt", "imt", "oas", "ft", "soat", "agent"))
_TOKEN_LITERALS: dict[str, tuple[str, ...]] = {
    "split-token": ("hf_", "sk-", *_GH, "github_pat_", "glpat-", "glrt-", *_XOX, "nvapi-", "r8_", "k_live_",
                    "ya29.", "AKIA", "eyJ"),
    "pem-private-key": ("-----BEGIN",),
    "jwt": (".ey",),
    "aws-access-key-id": ("A3T", "AKIA", "ASIA", "ABIA", "ACCA"),
    "gcp-api-key": ("AIza",),
    "huggingface-token": ("hf_",),
    "openai-key": ("sk-",),
    "slack-webhook": ("hooks.slack.com/",),
    "slack-token": _XOX,
    "slack-app-token": ("xapp-",),
    "github-token": _GH,
    "github-fine-grained-pat": ("github_pat_",),
    "gitlab-token": _GL,
    "ngc-api-key": ("nvapi-",),
    "google-oauth-token": ("ya29.",),
    "stripe-key": ("k_live_", "k_test_"),
    "replicate-token": ("r8_",),
    "mysql-password": ("mysql", "mariadb"),
}
_FOLDED_LITERALS: dict[str, tuple[str, ...]] = {
    "wandb-login": ("wandb",),
    "azure-sas-signature": ("sig=",),
    "authorization": ("authorization",),
    "bearer": ("bearer",),
    "cookie": ("cookie",),
}
_FOLD_FIRST = (("\u017f", "s"), ("\u0130", "i"), ("\u0131", "i"))


def _literal_index(literals: dict[str, tuple[str, ...]]) -> tuple[str, dict[str, frozenset[str]]]:
    """One alternation of every literal (longest first; compiled only without the Aho-Corasick
    package) and, per literal, the rules it may start: its own and those of every literal that
    is a prefix of it (found at the same place)."""
    by_literal: dict[str, set[str]] = {}
    for rule, words in literals.items():
        for word in words:
            by_literal.setdefault(word, set()).add(rule)
    closed = {word: frozenset().union(*(rules for other, rules in by_literal.items() if word.startswith(other)))
              for word in by_literal}
    ordered = sorted(by_literal, key=len, reverse=True)
    return "|".join(re.escape(word) for word in ordered), closed


_TOKEN_SCAN, _TOKEN_RULES_OF = _literal_index(_TOKEN_LITERALS)
_FOLDED_SCAN, _FOLDED_RULES_OF = _literal_index(_FOLDED_LITERALS)


def _rules_found(text: str, alternation: str, rules_of: dict[str, frozenset[str]]) -> set[str]:
    """The rules whose literals occur in `text`: one left-to-right scan; inside each match, the
    positions a literal could also start at (one literal's tail another's head) are tried too."""
    automaton = _automaton(tuple(rules_of))
    if automaton is not None:
        # every literal that occurs, overlapping ones too, in one pass at C speed: the regex
        # alternation below is tried at every position (~0.4 ms a 9 KB log, per alert; issue 20)
        return set().union(*(rules_of[word] for word in set(automaton.find_matches_as_strings(text, overlapping=True))))
    found: set[str] = set()
    position, scan = 0, re.compile(alternation)
    while (match := scan.search(text, position)) is not None:
        found |= rules_of[match.group(0)]
        for inner in range(match.start() + 1, match.end()):
            if (also := scan.match(text, inner)) is not None:
                found |= rules_of[also.group(0)]
        position = match.end()
    return found


@functools.cache
def _automaton(literals: tuple[str, ...]) -> Any:
    """An Aho-Corasick automaton of the literals, built when first needed; None without the package."""
    try:
        import ahocorasick_rs
    except ImportError:  # pragma: no cover - the regex scan finds the same literals, slower
        return None
    return ahocorasick_rs.AhoCorasick(list(literals))


def _candidates(text: str) -> set[str]:
    """The names of the rules with a literal that may match somewhere in `text`."""
    folded = text
    for odd, letter in _FOLD_FIRST:  # str.replace: ten times faster than str.translate here
        folded = folded.replace(odd, letter)
    return _rules_found(text, _TOKEN_SCAN, _TOKEN_RULES_OF) | _rules_found(folded.lower(), _FOLDED_SCAN,
                                                                           _FOLDED_RULES_OF)


def _may_match(rule: str, candidates: set[str] | None) -> bool:
    return candidates is None or rule in candidates or (rule not in _TOKEN_LITERALS
                                                        and rule not in _FOLDED_LITERALS)


def redact_structure(text: str, candidates: set[str] | None = None) -> str:
    """The name-based rules: assignments, flags, the Authorization header, URL passwords.
    `candidates` (from the prefilter) skips the rules whose literal is absent."""
    if _may_match("authorization", candidates):
        text = _AUTHORIZATION.sub(_authorization, text)
    if _may_match("bearer", candidates):
        text = _BEARER.sub(r"\1" + MASK, text)
    if _may_match("cookie", candidates):
        text = _COOKIE.sub(r"\1" + MASK, text)
    if candidates is None or "://" in text:
        text = _URL_USERINFO.sub(r"\1" + MASK + "@", text)
    if "--" in text:  # every match of _FLAG starts with it
        text = _mask_values(text, _FLAG)
    if ":" in text or "=" in text:  # every match of _ASSIGNMENT ends with one (`:=` holds `:`)
        text = _mask_values(text, _ASSIGNMENT)
    return text


def _may_hold_structure(text: str) -> bool:
    """Whether a name-based rule without a literal of the prefilter's could match: the URL password
    needs `://`, a flag `--`, an assignment `:` or `=`."""
    return ":" in text or "=" in text or "--" in text


def redact_tokens(text: str, rules: Iterable[Rule] = TOKEN_RULES, candidates: set[str] | None = None) -> str:
    for rule in rules:
        if _may_match(rule.name, candidates) and _holds_run(text, _RUN_NEEDED.get(rule.name, 0)):
            text = rule.pattern.sub(rule.replacement, text)
    return text


# The character-class rules with no literal that need a run of base64 characters ([A-Za-z0-9+/]):
# a PEM body line 60, a bare AWS secret key 40. A log rarely holds such a run, and the two searches
# cost ~0.25 ms a 9 KB log, which the evidence cache redacts at every new alert (issue 20). Tested
# on the text as the rule receives it: a rule before may have changed it.
_RUN_NEEDED = {"pem-body-line": 60, "aws-secret-key": 40}
BASE64_RUN = 16  # _BASE64 below matches runs of at least this many (and so do the two rules above)
_RUN_BYTES = bytes(b"a"[0] if chr(b).isascii() and (chr(b).isalnum() or chr(b) in "+/") else b" "[0] for b in range(256))


def _holds_run(text: str, length: int) -> bool:
    """Whether `text` holds `length` base64 characters in a row (0: always); every other character,
    any non-ASCII one's UTF-8 bytes included, breaks a run."""
    return length == 0 or b"a" * length in text.encode("utf-8", "surrogatepass").translate(_RUN_BYTES)


def compile_patterns(patterns: Sequence[str]) -> tuple[Rule, ...]:
    """Operator-configured patterns. The whole match is replaced by ***, or only the group
    named `secret` when the pattern has one. Raises RedactionPatternError naming the pattern."""
    rules = []
    for index, source in enumerate(patterns):
        try:
            pattern = re.compile(source)
        except re.error as exc:
            raise RedactionPatternError(
                f"redaction pattern {index + 1} {source!r} is not a valid regular expression: {exc}") from None
        if pattern.fullmatch(""):
            raise RedactionPatternError(
                f"redaction pattern {index + 1} {source!r} matches the empty string; it would mask everything")
        rules.append(Rule(f"configured-{index + 1}", source, MASK))
    return tuple(rules)


def _configured(rule: Rule, text: str) -> str:
    if "secret" not in rule.pattern.groupindex:
        return rule.pattern.sub(MASK, text)

    def inner(match: re.Match[str]) -> str:
        start, end = match.span("secret")
        if start < 0:
            return match.group(0)
        whole = match.group(0)
        return whole[: start - match.start()] + MASK + whole[end - match.start():]

    return rule.pattern.sub(inner, text)


_ZERO_WIDTH = re.compile("[\u200b\u200c\u200d\u2060\ufeff\u00ad]")
# base64 that decodes to a credential (`user:password`, or a token a rule knows) goes whole. The
# run of 16 is tested before the two case lookaheads (most words are shorter), and the run and its
# padding are possessive: a shorter one is followed by a run or `=` character, which the final
# lookahead refuses, so giving some back never found a match (0.19 -> 0.12 ms on the 8.6 KB log).
_BASE64 = re.compile(r"(?<![A-Za-z0-9+/=_-])(?=[A-Za-z0-9+/]{16})(?=[A-Za-z0-9+/]*[A-Z])(?=[A-Za-z0-9+/]*[a-z0-9])"
                     r"[A-Za-z0-9+/]{16,}+={0,2}+(?![A-Za-z0-9+/=_-])")
_CREDENTIAL = re.compile(r"[\w.@+-]{1,64}:[^\s:]{3,}")


def _base64_secret(match: re.Match[str]) -> str:
    word = match.group(0)
    try:
        decoded = base64.b64decode(word + "=" * (-len(word) % 4), validate=True).decode("ascii")
    except (ValueError, UnicodeDecodeError):
        return word
    if not decoded.isprintable():
        return word
    if _CREDENTIAL.fullmatch(decoded) or redact_tokens(decoded) != decoded:
        return MASK
    return word


SHORT_TEXT, SHORT_TEXTS_KEPT = 512, 4096  # characters; texts (at most about 4 MB, in and out)


class Redactor:
    """The built-in rules plus the operator's own patterns, for text, argv lists and env."""

    def __init__(self, extra_patterns: Sequence[str] = ()):
        self.configured = compile_patterns(extra_patterns)
        # The same short texts come back at every incident (a pod's field values, the node's
        # labels, a diagnosis's stock sentences: about 120 calls per new alert) and the rules are
        # a pure function of the text: so short ones are redacted once per process, bounded.
        self._short = functools.lru_cache(maxsize=SHORT_TEXTS_KEPT)(self._redact)

    def text(self, text: str) -> str:
        return self._short(text) if len(text) <= SHORT_TEXT else self._redact(text)

    def _redact(self, text: str) -> str:
        if _ZERO_WIDTH.search(text):  # invisible characters inside a token would hide it from every rule
            text = _ZERO_WIDTH.sub("", text)
        # the prefilter runs once, on the text as it arrives: a rule's replacement never writes
        # another rule's literal, so a rule absent here stays absent after the rules before it
        candidates = _candidates(text)
        if candidates or _may_hold_structure(text) or _holds_run(text, BASE64_RUN):
            text = redact_structure(redact_tokens(text, candidates=candidates), candidates)
            text = _BASE64.sub(_base64_secret, text)
        # else no built-in rule can match: each token rule needs a literal the text lacks or a run of
        # 40 or 60 base64 characters, each structure rule its literal, base64 a run of 16 (most of a
        # pod's and a diagnosis's short texts: ~5 us each of ~9 us; issue 20)
        for rule in self.configured:
            text = _configured(rule, text)
        return text

    def args(self, args: Sequence[str] | None) -> list[str]:
        """A container's command or args: `--api-key X`, `--api-key=X`, and every argument's
        text (a `sh -c` script, a URL with a password) through the text rules."""
        out: list[str] = []
        secret_flag: str | None = None
        for arg in args or []:
            arg = str(arg)
            if secret_flag is not None and not arg.startswith("--"):
                out.append(arg if _keeps_value(secret_flag, arg) else MASK)
                secret_flag = None
                continue
            secret_flag = None
            name, equals, value = arg.partition("=")
            if arg.startswith("--") and is_secret_name(name):
                if not equals:
                    secret_flag = name  # the value is the next argument
                    out.append(arg)
                else:
                    out.append(arg if _keeps_value(name, value) else f"{name}={MASK}")
                continue
            out.append(self.text(arg))
        return out

    def env(self, env: Sequence[Any] | None) -> list[Any]:
        """A container's env: the value of a secret-like name is replaced, any other value goes
        through the text rules; `valueFrom` (a reference to a Secret) is left as it is."""
        out: list[Any] = []
        for entry in env or []:
            if not isinstance(entry, dict) or not isinstance(entry.get("value"), str):
                out.append(entry)
                continue
            name, value = str(entry.get("name", "")), entry["value"]
            hidden = is_secret_name(name) and not _keeps_value(name, value)
            out.append({**entry, "value": MASK if hidden else self.text(value)})
        return out

    def field(self, name: str, value: Any) -> Any:
        """One container or pod field's value (command, args, env, probes, ...), redacted."""
        if name in ("command", "args") and isinstance(value, list):
            return self.args(value)
        if name == "env" and isinstance(value, list):
            return self.env(value)
        return self.structure(value)

    def fields(self, fields: dict[str, Any] | None) -> dict[str, Any]:
        """A {field: value} mapping (a container spec, an audit record's before/after), redacted."""
        return {k: self.field(k, v) for k, v in (fields or {}).items()}

    def structure(self, value: Any) -> Any:
        """Every string inside a JSON-like value through the text rules; a container spec found
        inside (a dict with command/args/env) gets the argv and env rules too."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.structure(v) for v in value]
        if isinstance(value, dict):
            return {k: self.field(k, v) if k in ("command", "args", "env") else self.structure(v)
                    for k, v in value.items()}
        return value

    def container(self, container: dict[str, Any]) -> dict[str, Any]:
        """A copy of a container spec with command, args and env redacted."""
        out = dict(container)
        for field in ("command", "args"):
            if isinstance(out.get(field), list):
                out[field] = self.args(out[field])
        if isinstance(out.get("env"), list):
            out["env"] = self.env(out["env"])
        return out


DEFAULT = Redactor()


def _wildcard(stored: str) -> re.Pattern[str]:
    """A redacted string as a pattern: every *** stands for any text (what was masked)."""
    return re.compile(".*?".join(re.escape(part) for part in stored.split(MASK)), re.DOTALL)


def has_mask(value: Any) -> bool:
    """Whether a JSON-like value holds a masked string anywhere."""
    if isinstance(value, str):
        return MASK in value
    if isinstance(value, list):
        return any(has_mask(v) for v in value)
    if isinstance(value, dict):
        return any(has_mask(v) for v in value.values())
    return False


def masked_match(stored: Any, live: Any) -> bool:
    """Whether `live` could be what `stored` is the redacted copy of: equal, except that every
    *** in a stored string stands for any text. Independent of the rules that masked it (the
    operator's patterns included), so a record written by one configuration still compares."""
    if isinstance(stored, str) and MASK in stored:
        return isinstance(live, str) and _wildcard(stored).fullmatch(live) is not None
    if isinstance(stored, list):
        return (isinstance(live, list) and len(stored) == len(live)
                and all(masked_match(s, v) for s, v in zip(stored, live)))
    if isinstance(stored, dict):
        return (isinstance(live, dict) and stored.keys() == live.keys()
                and all(masked_match(v, live[k]) for k, v in stored.items()))
    return bool(stored == live)


def redact(text: str) -> str:
    """Text with every built-in secret format masked (see the module docstring)."""
    return DEFAULT.text(text)


def redact_args(args: Sequence[str] | None) -> list[str]:
    return DEFAULT.args(args)


def redact_env(env: Sequence[Any] | None) -> list[Any]:
    return DEFAULT.env(env)
