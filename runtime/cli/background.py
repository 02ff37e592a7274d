"""How a command that launches a run in the background (`run --async`, `workflow --async`,
`resume`, `attach`) meets Ctrl-C, SIGTERM and SIGHUP while its launch request is in flight.

Owns those three signals from just before the request is sent until the command has said what
it launched (runtime/cli/ending.py's handlers, holding): the run id is printed as always, then
the command says the run goes on and exits 128 + the signal. A launch the node admitted is a
run that holds a capacity slot: cut short while waiting for the answer, the command used to
say `error: interrupted` and never print the id of a run that went on.

It never stops the run it launched. A foreground run's command stops its run on a signal
because the run lives as long as the command; a background run was asked to outlive it, and a
resume's continuation of a paused run, once stopped, could never be resumed (the paused run has
ended `stopped` by then): the id is printed so that `stop RUN` can end it. A signal that comes
before the request is sent ends the command with nothing launched, as before.
"""

from __future__ import annotations

from collections.abc import Callable

from subagents_node.cli.common import emit
from subagents_node.cli.ending import GONE, EndingSignals, best_effort
from subagents_node.cli.terminal import say
from subagents_node.messages.supervisor import RunView


def launch_in_background(send: Callable[[], RunView], as_json: bool, session: bool) -> RunView:
    """`send` the launch (or resume) and print the run it started (its id; its session on
    stderr too with `session`; the run as JSON with `as_json`), a signal held meanwhile; after
    a signal, the command then says the run goes on and exits 128 + the signal."""
    signals = EndingSignals()
    signals.hold()  # before the handlers are set: from then on a signal only counts
    with signals:
        started = send()
        writes = [(lambda: emit(started, as_json, started.run_id), False)]
        if session and not as_json:
            writes.append((lambda: say(f"session {started.session_id}", err=True), True))
        for write, err in writes:
            # A write that fails after a hangup must not keep the command from saying what it
            # launched where it still can, and exiting 129.
            best_effort(write, err, GONE if signals.pending is not None else ())
        if signals.pending is None:
            return started
        said = (
            f"interrupted: run {started.run_id} was launched and goes on "
            f"(`subagents-node stop {started.run_id}` ends it)"
        )
        best_effort(lambda: say(said, err=True), err=True)
        raise SystemExit(128 + signals.pending)
