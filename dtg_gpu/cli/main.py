"""`dtg`: the root only builds the parser and registers the sub-commands, one module each
(`dtg_gpu/cli/<command>.py`, shared flags in `common.py`)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings
from typing import Any

SUBCOMMANDS = ["sweep", "analyze", "featurize", "train", "predict", "watch", "evaluate", "bench", "env", "demo"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dtg",
        description="Predict from a run's checkpoints whether it ends with "
        "sufficient accuracy (dynamic temporal graphs).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="the usual workflow:\n"
        "  dtg demo --quick                              # a one-minute tour: open demo-out/report/index.html\n"
        "  dtg sweep --preset lenet5-digits --out SWEEP  # or your own runs' folders (--model pkg.module:Class)\n"
        "  dtg evaluate SWEEP -k 5                       # how early the verdict holds on your sweep\n"
        "  dtg train SWEEP -k 5 --out p.safetensors      # a predictor for the next sweep of this model\n"
        "  dtg watch NEW_SWEEP --predictor p.safetensors # stop/continue while it trains (advice: you act)\n"
        "every command has --help; --spec runs the seed's method exactly",
    )
    from dtg_gpu.core.version import __version__

    parser.add_argument("--version", action="version", version=f"dtg_gpu {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in SUBCOMMANDS:
        getattr(importlib.import_module(f"dtg_gpu.cli.{name}"), name).add_parser(sub)
    return parser


OOM_HINT = (
    "use --device cpu (usually more memory than a GPU), fewer --timesteps, or fewer runs at a time "
    "(featurize_sweep(solver=SolverOptions(chunk_size=...)) in Python)"
)
OOM_MARKS = ("out of memory", "can't allocate memory", "CUDA out of memory", "not enough memory")


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from dtg_gpu.exceptions import DTGWarning

    def show(message: Any, category: Any, *_args: Any, **_kwargs: Any) -> None:  # dtg_gpu's warnings, one line each
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
        except MemoryError as exc:
            if os.environ.get("DTG_DEBUG"):
                raise
            detail = f" ({_one_line(exc)})" if str(exc) else ""
            print(f"dtg {args.command}: error: out of memory{detail}; {OOM_HINT}", file=sys.stderr)
            return 1
        except (
            ValueError,
            OSError,
            RuntimeError,
            KeyError,
            TypeError,
            ImportError,
            ArithmeticError,
        ) as exc:  # DTGError derives from these
            if os.environ.get("DTG_DEBUG"):
                raise
            text = _one_line(exc)
            if isinstance(exc, RuntimeError) and any(m in text for m in OOM_MARKS):
                text += f"; {OOM_HINT}"
            print(f"dtg {args.command}: error: {text}", file=sys.stderr)
            return 1


if __name__ == "__main__":
    sys.exit(main())
