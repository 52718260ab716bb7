"""Command-line options that choose and configure a VLM backend, shared by the commands that load one."""

from __future__ import annotations

import argparse

from metavlm_ros.models.registry import BACKENDS, all_options, options_for

__all__ = ['add_model_arguments', 'create_backend_from_args', 'model_options', 'search_identity']


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that choose and configure a VLM backend: --backend, --model and every backend's own
    options, as the backends declare them (models/registry.py)."""
    group = parser.add_argument_group('model')
    group.add_argument('--backend', default='clip', help=f'{", ".join(BACKENDS)} (default: clip)')
    group.add_argument(
        '--model',
        default='demo',
        help="Hugging Face id or local directory; 'demo' = the embedded demo model; a served backend: "
        "the server's model id",
    )
    for option in all_options().values():
        takers = options_for(option.name)
        text = option.help + ('' if len(takers) == len(BACKENDS) else f' [{", ".join(takers)}]')
        if option.default is not None:
            text += f' (default: {option.default})'
        # Every default is None here: an option given for a backend that does not take it is refused.
        if option.type is list:
            group.add_argument(option.cli_flag, nargs='+', default=None, metavar='VALUE', help=text)
        elif option.type is dict:
            group.add_argument(option.cli_flag, action='append', default=None, metavar='KEY=VALUE', help=text)
        else:
            group.add_argument(
                option.cli_flag, dest=option.name, type=option.type, choices=option.choices, default=None,
                help=text,
            )  # fmt: skip


def model_options(args: argparse.Namespace) -> dict:
    """The options the model flags give for the chosen backend (refusing those it does not take)."""
    from metavlm_ros.models.registry import given_options

    values = {}
    for name, option in all_options().items():
        value = getattr(args, name, None)
        values[name] = option.from_items(value) if option.type is dict and value is not None else value
    return given_options(args.backend, values)


def create_backend_from_args(args: argparse.Namespace):
    """Build the VLM backend the model options describe."""
    from metavlm_ros.models.vlm import create_backend

    return create_backend(args.backend, args.model, **model_options(args))


def search_identity(args: argparse.Namespace, config) -> dict:
    """What identifies the searches of one `metavlm search` (search.json): settings, the model under
    test (backend, options, weights, what the backend adds, read before the model loads) and the
    source (frames read and judged in process)."""
    from metavlm_ros.models.vlm import identity_record, model_identity

    return identity_record(config, model_identity(args.backend, args.model, model_options(args)))
