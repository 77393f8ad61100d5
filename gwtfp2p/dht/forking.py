"""What a process forked from one that imported hivemind must do first: take hivemind's locks for its own.

hivemind creates its process-wide ``multiprocessing`` locks when it is imported (``MPFuture``'s update and
initialisation locks, ``SharedBytes``'), and a forked child shares them with its parent and every sibling.
The local swarms' zygote (``localswarm/zygote.py``) imports hivemind once and forks every daemon from it, so
one daemon (or its DHT process) SIGKILLed while it held ``MPFuture``'s update lock, in the middle of sending
a result, left the lock taken for every daemon forked after it: their DHT processes blocked reporting that
they were ready, and each start ended "the DHT did not start within 60 s" (a flake hunt's rounds at
da2d842 and e1a3fd4: every zygote-forked data holder after ``test_sigkilled_daemon_takes_its_dht_and_p2pd_along``;
``py-spy`` showed the DHT process in ``SemLock.__enter__`` under ``MPFuture._send_update``). A fork calls
``own_hivemind_locks`` first: its locks are then shared only with the processes it forks itself.
"""

from __future__ import annotations

from hivemind.utils.mpfuture import MPFuture


def own_hivemind_locks() -> None:
    """Fresh ``MPFuture``/``SharedBytes`` locks and a fresh ``MPFuture`` backend for this (forked) process."""
    MPFuture.reset_backend()
