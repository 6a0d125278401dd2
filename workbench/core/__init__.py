"""Pure foundations: tensor maths (losses, batching, chunked log-probs, sampling filters, devices), the
errors, JSON safety and config options. Imports nothing else of the package.
"""
