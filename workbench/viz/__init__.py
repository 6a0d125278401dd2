"""Presentation: one plot style, plotting helpers that draw on a given ``ax``, and the ipywidgets
``Explorer`` base. Imports only ``workbench.core``.
"""
