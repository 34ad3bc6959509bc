"""``dtg``: the root only builds the parser and registers sub-commands."""

from __future__ import annotations

import argparse
import os
import sys
import warnings

from . import commands

SUBCOMMANDS = ["sweep", "analyze", "featurize", "train", "predict", "watch", "evaluate", "bench", "env", "demo"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dtg",
        description="Predict from a run's checkpoints whether it ends with "
        "sufficient accuracy (dynamic temporal graphs).",
    )
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"dtg_gpu {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in SUBCOMMANDS:
        getattr(commands, name).add_parser(sub)
    return parser


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from ..exceptions import DTGWarning

    def show(message, category, *_args, **_kwargs):  # dtg_gpu's warnings, one line each
        print(f"dtg {args.command}: warning: {_one_line(message)}", file=sys.stderr)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # libraries' deprecation notices are not ours
        warnings.simplefilter("always", DTGWarning)
        warnings.showwarning = show
        try:
            return int(args.func(args) or 0)
        except KeyboardInterrupt:
            print("dtg: interrupted", file=sys.stderr)
            return 130
        except (
            ValueError,
            OSError,
            RuntimeError,
            KeyError,
            TypeError,
            ImportError,
        ) as exc:  # DTGError derives from these
            if os.environ.get("DTG_DEBUG"):
                raise
            print(f"dtg {args.command}: error: {_one_line(exc)}", file=sys.stderr)
            return 1


if __name__ == "__main__":
    sys.exit(main())
