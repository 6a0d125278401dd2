"""RLHF pitfalls workbench: trainers (PPO, GRPO, DPO), one diagnostics module per pitfall, plots,
widgets and the papermill runner behind the notebooks in ``notebooks/``.

Start with ``python -m workbench list`` or ``notebooks/00_quickstart.ipynb``.
"""

__version__ = "0.1.0"
