"""Microbatches through one node, in the order one travels: out, through the relays, back.

``outbox`` sends an output and keeps it until its gradient returns (deadlines, injected clock);
``receiver`` is the one receive side (hop records, duplicates, re-pointing, gradient resends) of relays
and of the data holder's tail; ``relay`` and ``holder`` do each role's compute; ``resend`` (pure) plans
and ``recovery`` carries out the resends of a lost hop; ``iterations`` is both roles' barrier.
"""
