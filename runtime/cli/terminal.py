"""Text from outside shown on a terminal: what the CLI prints of an agent file's description, a
run's label, error or output, a config value or a child's last line, made inert.

Owns how the CLI's human output applies messages/inert.py (`say`, `emit`, error lines, the rich
tables of `fleet` and a foreground run): every character a terminal acts on is shown as an
escape such as `\\x1b`, so that text from an agent file in a cloned repository, or from a
child, can neither move the cursor, clear the screen, retitle the window, write the clipboard
(OSC 52) nor overwrite a line with a carriage return. A table cell is also kept to one line,
and a rich table is given `Text`, never markup, so `[/x]` in a child's output is shown as it
is (it used to end `fleet` with rich's MarkupError).

It never changes what a command prints as data: `--json` (json.dumps escapes every control
character) and `logs`, which prints the children's output as they wrote it, as `cat` would.
It never imports rich until a rich cell is asked for (`ping` and friends stay light).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from subagents_node.messages.inert import one_line, printable

if TYPE_CHECKING:
    from rich.text import Text

__all__ = ["cell", "one_line", "printable", "say"]


def say(text: str, err: bool = False) -> None:
    """Print a line of human output (stdout, or stderr with `err`), made `printable`."""
    click.echo(printable(text), err=err)


def cell(text: object) -> Text:
    """A rich table cell (or title): `one_line` of `text`, as Text, so rich reads no markup in
    it (`[bold]`, `[link=…]`, or a `[/x]` that would raise)."""
    from rich.text import Text

    return Text(one_line(str(text)))
