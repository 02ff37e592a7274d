"""Text from outside shown on a terminal: what the CLI prints of an agent file's description, a
run's label, error or output, a config value or a child's last line, made inert.

Owns the one rule for the CLI's human output (`say`, `emit`, error lines, the rich tables of
`fleet` and a foreground run): every character a terminal acts on (the C0 controls but newline
and tab, DEL, the C1 controls) is shown as an escape such as `\\x1b`, so that text from an
agent file in a cloned repository, or from a child, can neither move the cursor, clear the
screen, retitle the window, write the clipboard (OSC 52) nor overwrite a line with a carriage
return. A table cell is also kept to one line, and a rich table is given `Text`, never markup,
so `[/x]` in a child's output is shown as it is (it used to end `fleet` with rich's
MarkupError).

It never changes what a command prints as data: `--json` (json.dumps escapes every control
character) and `logs`, which prints the children's output as they wrote it, as `cat` would.
It never imports rich until a rich cell is asked for (`ping` and friends stay light).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from rich.text import Text

#: The characters a terminal acts on: C0 (newline and tab are text), DEL, and C1 (which a
#: terminal may read as ESC + a letter: U+009B is CSI).
_CONTROLS = [*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F, *range(0x80, 0xA0)]
_SHOWN = {code: f"\\x{code:02x}" for code in _CONTROLS}
#: One line: a newline is shown as `\n` too, a tab as a space (a cell's width stays its own).
_SHOWN_IN_LINE = {**_SHOWN, 0x0A: "\\n", 0x09: " "}


def printable(text: str) -> str:
    """`text` with each terminal control shown as an escape; newlines and tabs kept (a CRLF
    line end is a newline). Text with none is returned as it is."""
    if text.isprintable():  # the usual case: one C call, nothing copied
        return text
    return text.replace("\r\n", "\n").translate(_SHOWN)


def one_line(text: str) -> str:
    """`printable`, on one line: for a table cell or a field inside a line of ours."""
    if text.isprintable():
        return text
    return text.replace("\r\n", "\n").translate(_SHOWN_IN_LINE)


def say(text: str, err: bool = False) -> None:
    """Print a line of human output (stdout, or stderr with `err`), made `printable`."""
    click.echo(printable(text), err=err)


def cell(text: object) -> Text:
    """A rich table cell (or title): `one_line` of `text`, as Text, so rich reads no markup in
    it (`[bold]`, `[link=…]`, or a `[/x]` that would raise)."""
    from rich.text import Text

    return Text(one_line(str(text)))
