"""Subcommands of the `metavlm` command, one module each (`add_parser`, `run`)."""

import importlib

# Module names under metavlm_ros.commands; a module that fails to import (an optional dependency
# missing) is reported when its subcommand is used, not when another subcommand runs.
COMMANDS = (
    'search',
    'scenes',
    'replay',
    'run',
    'campaign',
    'report',
    'demo',
    'render',
    'train_demo_models',
    'export',
    'upgrade',
    'verify',
    'compare',
    'modes',
    'harden',
)


def load(name: str):
    """Import and return the subcommand module `name`."""
    return importlib.import_module(f'{__name__}.{name}')
