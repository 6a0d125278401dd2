"""Pure foundations: tensor maths (losses, batching, chunked log-probs, sampling filters, devices), the
errors, JSON safety, config options, paths, and how worker processes start (``worker_processes``). Imports
nothing else of the package.
"""
