"""Optional plain-language wording through any OpenAI-compatible endpoint.

May import: `bot.diagnosis` (what it words, and redaction) and the `openai` client. The model never
chooses a change; its text is dropped when it states a number the diagnosis does not.
"""
