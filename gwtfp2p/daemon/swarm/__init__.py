"""The swarm as one node sees it: DHT view, liveness (the one failure detector), links, transfers, flow.

``view`` heartbeats and reads the run's records; ``liveness`` decides who is dead; ``links`` measures
RTT and bandwidth; ``sending`` sends tensors with adaptive deadlines; ``routing`` drives the node's
``FlowNode``; ``neighbours`` turns records into flow neighbours; ``placing``, ``instance`` and ``watch``
read the swarm as a flow instance (stage choice, status, dead stages).
"""
