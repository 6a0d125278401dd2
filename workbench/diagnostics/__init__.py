"""Diagnostics: one module per pitfall, each a set of pure measurements a notebook plots and a
user can run against their own model or batch.

* ``position_ids`` — S1: log-prob drift of padded vs unpadded copies of the same text.
* ``eos`` — S3 and P8: generation cost with and without EOS stopping; EOS dropped by pad masks.
"""
