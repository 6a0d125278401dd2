"""STAND-IN for ``flash_attn.utils`` (see ../../README.md)."""
