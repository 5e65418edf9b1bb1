"""The redaction prefilter (issue 20): one combined scan finds which rules' literals occur, and
only those rules run. It must change nothing: the output is the same as with every rule run, on
every secret format, on texts where literals overlap, and where Unicode case folding is needed."""

from __future__ import annotations

import random

import pytest
from secret_formats import FORMATS

from bot.diagnosis import redact as R


def every_rule(text: str) -> str:
    """Redactor.text with the prefilter off: each rule in order over the whole text."""
    text = R._ZERO_WIDTH.sub("", text)
    text = R.redact_structure(R.redact_tokens(text))
    return R._BASE64.sub(R._base64_secret, text)


CORPUS = [text for fmt in FORMATS for text in (fmt.log, f"{fmt.env[0]}={fmt.env[1]}" if fmt.env else None)
          if text is not None]
CORPUS += [
    "AuthorIzation: Bearer abcdefgh12345678",
    "Author\u0131zation: token abcdefgh12345678",  # dotless i: IGNORECASE matches it to i
    "Coo\u212aie: session=abc123def456",  # Kelvin sign
    "https://example.com/x?\u017fig=abcdefgh12345678&x=1",  # long s
    "AKIAhf_abcdefghijklmnopqrstuvwxyz0123",  # one literal's tail overlapping the next one's head
    "xoxb-ghp_abcdefghijklmnopqrstuvwxyz0123456789",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.abc",
    "sk_live_abcdefghijklmnopqrstu sk-proj-abcdefghijklmnopqrstuvwx",
    "wandb   login --relogin abcdefghijklmnopqrstuvwxyz",
    "mysql -h db -uroot -pS3cretPass; mariadb-dump -pAn0ther",
]


@pytest.mark.parametrize("text", CORPUS)
def test_prefilter_changes_nothing(text):
    assert R.Redactor().text(text) == every_rule(text)


def test_prefilter_changes_nothing_on_mixed_fragments():
    """Random texts built from every rule's literals, token bodies and separators."""
    literals = sorted({w for words in (*R._TOKEN_LITERALS.values(), *R._FOLDED_LITERALS.values()) for w in words})
    pieces = [*literals, *(w.upper() for w in literals), "abcdefghijklmnopqrstuvwxyz0123456789", "ABCDEFGHIJ0123",
              " ", "\n", "=", ": ", "://u:p@", "\u0131", "\u017f", "-", "_", "."]
    rng = random.Random(20)
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 12)))
        assert R.Redactor().text(text) == every_rule(text), text


def test_each_literal_is_a_necessary_condition_of_its_rule():
    """Every match a rule finds in the corpus holds one of the rule's literals, so skipping the
    rule when none occurs skips nothing."""
    rules = {rule.name: rule.pattern for rule in R.TOKEN_RULES}
    rules |= {"authorization": R._AUTHORIZATION, "bearer": R._BEARER, "cookie": R._COOKIE}
    for literals, fold in ((R._TOKEN_LITERALS, False), (R._FOLDED_LITERALS, True)):
        for name, words in literals.items():
            for text in CORPUS:
                for match in rules[name].finditer(text):
                    found = match.group(0)
                    for odd, letter in R._FOLD_FIRST if fold else ():
                        found = found.replace(odd, letter)
                    found = found.lower() if fold else found
                    assert any(w in found for w in words), (name, match.group(0))


def test_the_literal_tables_name_real_rules():
    """A misspelt name would leave its rule unfiltered (always run): harmless, but not what was meant."""
    assert set(R._TOKEN_LITERALS) <= {rule.name for rule in R.TOKEN_RULES}


@pytest.mark.parametrize("text", CORPUS)
def test_a_short_text_redacted_again_gives_the_same_answer(text):
    """Short texts are redacted once per redactor (the same pod fields come back at every alert)."""
    redactor = R.Redactor()
    assert redactor.text(text) == redactor.text(text) == every_rule(text)


def test_each_redactor_keeps_its_own_answers():
    assert R.Redactor().text("ticket ACME-123456") == "ticket ACME-123456"
    assert R.Redactor([r"ACME-\d+"]).text("ticket ACME-123456") == "ticket ***"
    long_text = "ticket ACME-123456 " * 100  # above the short-text size: redacted every time
    assert R.Redactor([r"ACME-\d+"]).text(long_text) == "ticket *** " * 100


# 37 base64 characters, then a JWT whose masked form 'eyJ***' makes the run 40 long: a bare AWS key
RUN_MADE_BY_A_RULE = "/" * 37 + "ey_abcdefghijkl.eyabcdefghijkl.xyz end"


def test_the_run_gate_changes_nothing():
    """PEM body lines and bare AWS keys are searched only in a text holding a long enough run of
    base64 characters (issue 20), tested on the text as each rule receives it, not as it arrived."""
    for text in [*CORPUS, RUN_MADE_BY_A_RULE]:
        expected = text
        for rule in R.TOKEN_RULES:
            expected = rule.pattern.sub(rule.replacement, expected)
        assert R.redact_tokens(text) == expected, text
    assert R.redact_tokens(RUN_MADE_BY_A_RULE) == "****** end"


# The name-assignment and base64 patterns as they were written before they were made possessive
# (issue 20): the faster spellings must find exactly the same matches.
ASSIGNMENT_BEFORE = r"(?P<q>[\"']?)(?P<name>\b[A-Za-z_][A-Za-z0-9_.-]{0,80})(?P=q)(?P<sep>\s*(?::=|=|:)\s*)"
BASE64_BEFORE = (r"(?<![A-Za-z0-9+/=_-])(?=[A-Za-z0-9+/]*[A-Z])(?=[A-Za-z0-9+/]*[a-z0-9])[A-Za-z0-9+/]{16,}={0,2}"
                 r"(?![A-Za-z0-9+/=_-])")


def _spans(pattern, text):
    return [(m.span(), m.groupdict().get("name")) for m in pattern.finditer(text)]


def test_the_possessive_patterns_find_what_the_backtracking_ones_found():
    import re
    from pathlib import Path

    before = {"assignment": (re.compile(ASSIGNMENT_BEFORE), R._ASSIGNMENT), "base64": (re.compile(BASE64_BEFORE), R._BASE64)}
    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    texts = [*CORPUS, *(p.read_text(errors="replace") for p in sorted(fixtures.rglob("*.log"))[:60])]
    pieces = ["api_key", "Token", "pass_word", '"', "'", " ", "\t", ":", "=", ":=", "a" * 79, "b" * 3, "X.y", "-",
              "\u00e9", "\u00e9_key", "\n", "+", "/", "==", "AbCdEfGh", "01234567", "_-", "\u200b"]
    rng = random.Random(21)
    texts += ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 24))) for _ in range(4000)]
    for name, (old, new) in before.items():
        for text in texts:
            assert _spans(new, text) == _spans(old, text), (name, text)


def test_the_no_rule_shortcut_changes_nothing():
    """Texts around the shortcut's gates (no literal, no `:`, `=` or `--`, runs of base64 characters
    just under and over 16, 40 and 60): the same as every rule run."""
    pieces = ["AbCdEfGh", "12345678", "+/", "-", "_", ".", " ", "\n", "x", "dXNlcjpwYXNzd29yZA==", "Zm9vOmJhcg",
              "\u00e9", "-", "vllm-cpu-003-27190d4333-abcde", "--", "=", ":", "A" * 39, "b" * 59]
    rng = random.Random(22)
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 10)))
        assert R.Redactor().text(text) == every_rule(text), text
