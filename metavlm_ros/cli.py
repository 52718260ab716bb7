"""The `metavlm` command: a thin dispatcher over metavlm_ros.commands."""

import argparse
import errno
import sys

from metavlm_ros import __version__, commands
from metavlm_ros.common.errors import MetaVLMError

STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser with every available subcommand."""
    parser = argparse.ArgumentParser(
        prog='metavlm',
        description='Search-based metamorphic testing of vision-language models for underwater robots.',
    )
    parser.add_argument('--version', action='version', version=f'metavlm_ros {__version__}')
    subparsers = parser.add_subparsers(dest='command', metavar='COMMAND', required=True)
    for name in commands.COMMANDS:
        try:
            module = commands.load(name)
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith('metavlm_ros.commands'):
                continue  # subcommand not built yet
            raise
        module.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the `metavlm` command; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except MetaVLMError as exc:
        print(f'metavlm: error: {exc}', file=sys.stderr)
        return 2
    except OSError as exc:
        # Last resort for a full, read-only or vanished disk that no command turned into its own
        # message: one line, not a traceback (the commands keep what they wrote whole).
        if exc.errno not in STORAGE_ERRNOS:
            raise
        where = f'{exc.filename}: ' if exc.filename else ''
        print(f'metavlm: error: {where}{exc.strerror or exc}', file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print('metavlm: interrupted; results written so far are kept', file=sys.stderr)
        return 130


def entry_point() -> None:
    """The `metavlm` executable: main(), then exit with its code (metavlm_ros.common.process.finish)."""
    from metavlm_ros.common.process import finish

    finish(main())


if __name__ == '__main__':
    entry_point()
