"""The shell of a Dockerfile's instructions, as far as reading what it installs needs: instructions with their
continuation lines joined (each physical line's number kept), ``$NAME``/``${NAME}`` expanded from ``ARG``/``ENV``
values, and a ``RUN`` split into its commands at ``&&``, ``||``, ``;``, ``|`` and parentheses, each word with the
line it is on. Quoting follows POSIX shell (``shlex``); nothing is executed."""

from __future__ import annotations

import io
import re
import shlex

_SEPARATORS = {"&&", "||", ";", "|", "(", ")", "&", ";;"}


def logical_lines(text: str) -> list[list[tuple[int, str]]]:
    """Instructions, each as its physical lines (number, text without the trailing backslash); comment and
    empty lines inside a continued instruction are dropped, as the builder drops them."""
    out: list[list[tuple[int, str]]] = []
    parts: list[tuple[int, str]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            parts.append((number, stripped[:-1]))
            continue
        parts.append((number, stripped))
        out.append(parts)
        parts = []
    if parts:
        out.append(parts)
    return out


def expand(text: str, values: dict[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        return values.get(name, m.group(0))

    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)", sub, text)


def commands(lines: list[tuple[int, str]]) -> list[tuple[list[int], list[str]]]:
    """The shell commands of a RUN, each with the physical line of each of its words."""
    text = " ".join(fragment for _, fragment in lines)
    starts, offset = [], 0
    for number, fragment in lines:
        starts.append((offset, number))
        offset += len(fragment) + 1

    def line_at(position: int) -> int:
        return max((number for start, number in starts if start <= position), default=lines[0][0])

    stream = io.StringIO(text)
    lexer = shlex.shlex(stream, posix=True, punctuation_chars=";&|()")
    lexer.whitespace_split = True
    lexer.commenters = ""
    commands: list[tuple[list[int], list[str]]] = []
    current: list[str] = []
    numbers: list[int] = []
    try:
        for token in lexer:
            if token in _SEPARATORS:
                if current:
                    commands.append((numbers, current))
                current, numbers = [], []
                continue
            numbers.append(line_at(max(0, stream.tell() - len(token) - 1)))
            current.append(token)
    except ValueError:  # an unbalanced quote: keep what was read
        pass
    if current:
        commands.append((numbers, current))
    return commands
