"""A step process that ends when the runner that started it is gone.

``quadforge reproduce`` runs each step as a child process. Ctrl-C and SIGTERM on the runner stop its
children (``tools.reproduce_quard.stop_children``), but SIGKILL cannot be caught, and a runner killed
alone would leave its steps running as orphans, writing into a run nobody watches. So the runner names
itself in ``PARENT_ENV`` and the child (``quadforge.tools.cli.main``) calls ``watch_parent``: a daemon
thread that sends the child SIGTERM, its usual stop, once its parent process has changed.

The alternative, ``PR_SET_PDEATHSIG`` set between fork and exec, needs ``preexec_fn``, which Python
warns can deadlock in a process with threads (the runner's ``--jobs`` threads start the steps), and it
fires when the *thread* that started the child exits, not the process.
"""
from __future__ import annotations

import os
import signal
import threading
import time

PARENT_ENV = "QUADFORGE_PARENT_PID"
POLL_S = 1.0


def watch_parent(poll_s: float = POLL_S) -> bool:
    """Start the watcher when ``PARENT_ENV`` names this process's parent; True when started. The variable
    is removed from this process's environment, so the step's own children (DDP ranks, helpers) do not
    watch a process that is not theirs."""
    named = os.environ.pop(PARENT_ENV, None)
    if not named or not named.isdigit() or int(named) != os.getppid():
        return False
    parent = int(named)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
    return True
