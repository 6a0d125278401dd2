"""The command line: ``python -m workbench {list,run,train,audit}`` (``main``).
"""
