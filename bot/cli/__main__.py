"""`python -m bot.cli`: the same as the `vllm-oncall` command."""

import sys

from bot.cli import main

sys.exit(main())
