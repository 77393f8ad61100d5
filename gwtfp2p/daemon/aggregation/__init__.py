"""Replicas of one part acting as one: membership, agreement on contributions, the step, joining.

``members`` (who aggregates when), ``membership`` (notices and answers), ``agreement`` (pure: which
contributions an iteration uses), ``settle`` (pure: whom to probe, when to give up), ``aggregator``
(the all-gather and the step), ``steplog`` and ``state`` (what joiners download or replay),
``joining`` (a newcomer's download and handshake), ``checkpoint`` (local checkpoints).
"""
