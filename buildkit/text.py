"""Text from programs we run, made readable (terminal control sequences taken out), and text put in a Markdown table."""

from __future__ import annotations

import re

# Every ANSI CSI sequence: colours (ESC[91m ... ESC[0m) and cursor or line control (ESC[2K, ESC[?25l).
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def strip_ansi(text: str) -> str:
    return ANSI_ESCAPE.sub("", text)


def md_cell(text: object) -> str:
    """``text`` as one Markdown table cell: its pipes escaped, its line breaks made spaces."""
    return str(text).replace("|", "\\|").replace("\n", " ")
