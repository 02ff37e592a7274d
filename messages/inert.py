"""Text from outside made inert: each character a terminal or a line-by-line reader acts on,
shown as an escape (`\\x1b`), never passed on.

Owns the one table both sides use: the CLI for what it shows people (runtime/cli/terminal.py:
an agent file's description, a child's last line, a run's error) and the node for its log
records (runtime/node/nodelog.py: a field name in a refused request must neither forge a line
of node.log nor reach an operator's terminal as a control sequence). The controls are C0 but
newline and tab, DEL, and C1 (a terminal may read U+009B as CSI). Pure; it imports nothing and
never decides what is shown, only how.
"""

from __future__ import annotations

_CONTROLS = [*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F, *range(0x80, 0xA0)]
_SHOWN = {code: f"\\x{code:02x}" for code in _CONTROLS}
#: One line: a newline is shown as `\n` too, a tab as a space (a cell's width stays its own).
_SHOWN_IN_LINE = {**_SHOWN, 0x0A: "\\n", 0x09: " "}


def printable(text: str) -> str:
    """`text` with each control shown as an escape; newlines and tabs kept (a CRLF line end is a
    newline). Text with none is returned as it is."""
    if text.isprintable():  # the usual case: one C call, nothing copied
        return text
    return text.replace("\r\n", "\n").translate(_SHOWN)


def one_line(text: str) -> str:
    """`printable`, on one line: for a table cell, a log record, a field inside a line."""
    if text.isprintable():
        return text
    return text.replace("\r\n", "\n").translate(_SHOWN_IN_LINE)
