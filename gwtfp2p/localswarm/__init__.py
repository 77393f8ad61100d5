"""Local swarms of real ``gwtf join`` processes on one machine, and the chaos tooling that crashes them.

``processes`` starts daemons (each in its own process group, dying with its parent) and collects
their JSON events; ``chaos``, ``chaos_run`` and ``chaos_figures`` crash relays at seeded moments and
judge what that did to training. Used by ``gwtf demo``, the integration tests and the benchmarks;
nothing here imports the daemon (it is driven through its command line).
"""
