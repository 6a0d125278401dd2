"""A real inference engine in the loop: vLLM's CPU build sampling the rollouts of the workbench's trainers.

``envs`` builds the engine environment (``make engines``), ``server`` is the engine side run in it, ``sampler`` the
host side (``EngineSampler``), ``checks`` what the engine accepts. Import each name from its module.
"""
