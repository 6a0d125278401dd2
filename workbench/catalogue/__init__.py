"""The notebook catalogue: reading the notebooks (listing), what a notebook calls (notebook_api),
the batch runner (batch) and the report.
"""
