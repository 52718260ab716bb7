"""Typed exceptions of metavlm_ros; their text is a one-line message meant for users."""

__all__ = [
    'BagError',
    'InputError',
    'MetaVLMError',
    'ModelError',
    'ParameterError',
    'ResultsError',
    'SearchInterrupted',
    'StorageError',
]


class MetaVLMError(Exception):
    """Base of every error metavlm_ros reports to a user."""


class InputError(MetaVLMError):
    """A frame, image file, folder, bag, topic or encoding that cannot be used."""


class BagError(InputError):
    """A bag that is corrupt, of unknown storage, or lacks the requested topic."""


class ModelError(MetaVLMError):
    """A model that is missing, cannot be loaded, or an unknown backend."""


class ParameterError(MetaVLMError):
    """A parameter or configuration value that is invalid or out of range."""


class StorageError(MetaVLMError):
    """An output that cannot be written: disk full, read-only file system, missing or foreign directory."""


class ResultsError(MetaVLMError):
    """Results on disk that are damaged, or that belong to another search than the one asked for."""


class SearchInterrupted(MetaVLMError):
    """Raised by a backend whose caller is ending the search (a node shutting down) mid-generation.

    `run_search` drops the generation in progress and finishes the search with what it recorded.
    """
