"""The Slack side: Block Kit messages, a ChatPort over the Web API, the Bolt app, and a
terminal stand-in that prints what would be posted."""
