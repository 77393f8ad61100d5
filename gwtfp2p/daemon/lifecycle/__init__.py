"""A node's life: build the components in order, serve, leave gracefully, shut down.

``node`` owns the order (and is the only module that sees the whole node); ``inbox`` routes every RPC
to its receiver; ``run_spec``, ``parts`` and ``self_report`` are the start-up and reporting steps;
``leaving`` is the graceful leave; ``signals`` maps SIGINT/SIGTERM to it.
"""
