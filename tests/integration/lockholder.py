"""Run by ``test_zygote.py`` as a zygote child (``python -m tests.integration.lockholder hold|take``): ``hold``
takes hivemind's process-wide ``MPFuture`` update lock and dies by SIGKILL holding it; ``take`` exits 0 if it
can take that lock within 10 s, else 3."""

from __future__ import annotations

import os
import signal
import sys

from hivemind.utils.mpfuture import MPFuture

if __name__ == "__main__":
    if sys.argv[1:] == ["hold"]:
        MPFuture._update_lock.acquire()
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(0 if MPFuture._update_lock.acquire(timeout=10) else 3)
