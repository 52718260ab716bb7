"""metavlm_ros: search-based metamorphic testing of vision-language models on underwater robots."""

__version__ = '0.1.0'
