"""Experiments: the same trainer run with the bug on and off over seeds, held-out evaluation, and the
statistics that turn the runs into a conclusion.
"""
