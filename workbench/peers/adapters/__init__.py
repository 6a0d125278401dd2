"""Adapters: one module per peer, each run inside that peer's environment as
``python -m workbench.peers.adapters.<name> '<json args>'``; they import only the peer, torch,
``workbench.audit``, ``workbench.watch`` (both torch + standard library) and ``workbench.peers.protocol``."""
