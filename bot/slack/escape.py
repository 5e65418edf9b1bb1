"""Making text from logs and pods harmless in Slack mrkdwn.

Slack turns `<!channel>`, `<@U123>` and `<http://x|y>` into pings and links, and decodes
&amp; &lt; &gt; everywhere, also inside code blocks. Escaping those three characters makes
every such sequence literal. Bare @channel/@here/@everyone only ping with link_names, which we
never set, but a word joiner after the @ keeps them inert even if a client re-parses them.
"""

from __future__ import annotations

import re

WORD_JOINER = "\u2060"
ZERO_WIDTH_SPACE = "\u200b"
_BROADCAST = re.compile(r"@(channel|here|everyone)\b", re.IGNORECASE)


def escape(text: object) -> str:
    s = str(text if text is not None else "")
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _BROADCAST.sub(lambda m: "@" + WORD_JOINER + m.group(1), s)


def code_block(text: str, limit: int = 2900) -> str:
    """A ``` block whose content cannot close it early: runs of backticks get zero-width
    spaces between them, so a log line with ``` stays inside the block."""
    body = escape(text)
    body = re.sub(r"`{3,}", lambda m: ZERO_WIDTH_SPACE.join(m.group(0)), body)
    if len(body) > limit:
        body = body[: limit - 20] + "\n… (truncated)"
    return f"```\n{body}\n```"


def inline_code(text: str) -> str:
    return "`" + escape(text).replace("`", "'") + "`"


def unescape(text: str) -> str:
    """For the terminal: show what a Slack reader sees."""
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
