"""``dtg``: the root only builds the parser and registers sub-commands."""

from __future__ import annotations

import argparse
import sys
import warnings

from . import commands

SUBCOMMANDS = ["sweep", "analyze", "featurize", "train", "predict", "evaluate", "bench", "env", "demo"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dtg", description="Predict from a run's checkpoints whether it ends with "
                                "sufficient accuracy (dynamic temporal graphs).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in SUBCOMMANDS:
        getattr(commands, name).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    warnings.filterwarnings("default", module="dtg_gpu")
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("dtg: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError, RuntimeError) as exc:  # DTGError derives from these
        print(f"dtg {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
