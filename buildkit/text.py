"""Text from programs we run, made readable: terminal control sequences taken out."""

from __future__ import annotations

import re

# Every ANSI CSI sequence: colours (ESC[91m ... ESC[0m) and cursor or line control (ESC[2K, ESC[?25l).
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def strip_ansi(text: str) -> str:
    return ANSI_ESCAPE.sub("", text)
