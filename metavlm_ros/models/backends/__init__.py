"""The registered VLM backends: every module here registers its own (models/registry.py imports them all)."""
