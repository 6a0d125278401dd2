"""The peer lab: the seeds' bugs run in the original libraries' released code, each release in its own
pinned virtual environment (``envs``), probed by adapters that run inside those environments
(``adapters``, ``protocol``) and report JSON to the host (``runner``, ``lab``).

Nothing here imports a peer at module level: the host never imports TRL 0.x, verl or OpenRLHF.
"""
