"""gwtfp2p: churn-tolerant decentralized training of LLMs (GWTF) on volunteer GPUs.

Sub-packages follow docs/architecture.md: ``flow`` and ``sim`` are pure; ``model`` holds torch code;
``dht`` and ``transport`` are the only places that talk to hivemind; ``daemon`` runs a node.
"""

__version__ = "0.1.0"
