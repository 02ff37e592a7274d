"""Starting the agent command of one child: its stdio files, its process group, its cwd.

Owns the spawn itself and the one-line error that names what could not be used (the cwd, a
file, the command), never argv (it may hold the task, R-MISC-1). Standard library only, and
messages/statefiles.py (the shim template imports it). It never waits for or signals the
child: the shim does.
"""

from __future__ import annotations

import errno
import os
import signal
from collections.abc import Callable
from typing import Any

from subagents_node.messages import statefiles


def spawn_error(order: dict[str, Any], err: OSError) -> str:
    """One line naming what could not be used (the cwd, a file or the command), never argv."""
    what = err.strerror or str(err)
    if err.filename == order["cwd"]:
        return f"cannot start the child: working directory {order['cwd']}: {what}"
    if err.filename in (order.get("stdin_path"), order["stdout_path"], order["stderr_path"]):
        return f"cannot start the child: {err.filename}: {what}"
    return f"cannot start {order['argv'][0]}: {what}"


def _open_stdio(order: dict[str, Any]) -> list[int]:
    """The child's stdin, stdout and stderr, opened here (an error names the file). The logs
    by statefiles' rules: a link planted under a log's name (by a sibling child, which knows
    the run's directory) would have this child's output appended to the file it names, and
    a FIFO would hold the shim, so the child never started."""
    append = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    opens: tuple[tuple[str, Callable[[str], int]], ...] = (
        (order.get("stdin_path") or os.devnull, lambda p: os.open(p, os.O_RDONLY | os.O_CLOEXEC)),
        (order["stdout_path"], lambda p: statefiles.open_file(p, append)),
        (order["stderr_path"], lambda p: statefiles.open_file(p, append)),
    )
    fds: list[int] = []
    try:
        for path, opened in opens:
            try:
                fds.append(opened(path))
            except OSError as err:
                err.filename = path
                raise
    except OSError:
        for fd in fds:
            os.close(fd)
        raise
    return fds


def executable_of(argv0: str, env: dict[str, str]) -> str:
    """The file `argv0` names, searched in the child's own PATH (as execvpe would); OSError
    (ENOENT, EACCES) naming `argv0` when there is none that can run."""
    if "/" in argv0:
        return argv0
    denied: str | None = None
    for directory in os.get_exec_path(env):
        path = os.path.join(directory, argv0)
        if os.path.isfile(path):
            if os.access(path, os.X_OK):
                return path
            denied = denied or path
    if denied is not None:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), argv0)
    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), argv0)


#: Every signal is at its default in the child, as in one a bare `subprocess.Popen` starts: what
#: Python ignores (SIGPIPE, SIGXFSZ), and what the node's owners ignore because the node handles
#: it for them (SIGINT, SIGHUP: runtime/node/ownerproc.py), which the shim template inherited
#: and every child with it (an ignored signal stays ignored across exec): Ctrl-C in an agent's
#: own terminal UI, or a hangup sent to its job, did nothing to it or to what it started.
_DEFAULT_SIGNALS = frozenset(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}


def spawn_agent(order: dict[str, Any]) -> int:
    """Start the agent in its own process group, stdio to its files, in its cwd; its pid.

    Through `posix_spawn` (vfork + exec in libc), not `os.fork()` and not `subprocess`: a fork
    of the shim copies its page tables and faults in every page the forked Python touches
    before exec, and `subprocess` runs (and copies the pages of) a good deal of Python per
    spawn. The shim changes into the child's cwd for the spawn (posix_spawn has no chdir in
    Python) and back to / after it. Every fd of the shim is close-on-exec, so the child gets
    exactly its three stdio files. Raises OSError naming what could not be used
    (`spawn_error` turns it into one line)."""
    argv: list[str] = order["argv"]
    env: dict[str, str] = order["env"]
    path = executable_of(argv[0], env)
    stdio = _open_stdio(order)
    try:
        os.chdir(order["cwd"])
        try:
            return os.posix_spawn(
                path,
                argv,
                env,
                file_actions=[(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(stdio)],
                setpgroup=0,
                setsigdef=_DEFAULT_SIGNALS,
                setsigmask=(),  # and none blocked, whatever the thread that started the shim had
            )
        except OSError as err:
            err.filename = argv[0]
            raise
        finally:
            os.chdir("/")
    finally:
        for fd in stdio:
            os.close(fd)
