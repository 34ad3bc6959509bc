r"""Watch a sweep folder while it trains: each run's $P(\text{sufficient})$ and a
stop/continue verdict as its checkpoints land, outside any framework (`dtg watch`).

A run folder counts as finished when its `run.json` says `complete` (`dtg sweep`'s
format); until then its checkpoint files are read as they appear (files are written under a
temporary name and renamed, so a half-written one is never seen). Finished runs with a
`final_accuracy` teach the online rule; a given predictor is used as is. Each checkpoint is
summarised once ([`run_records`][dtg_gpu.early_stopping.records.run_records]), so a pass costs only the new
checkpoints.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dtg_gpu.core.validation import is_number
from dtg_gpu.early_stopping.records import is_diverged, many_run_records, run_records
from dtg_gpu.early_stopping.rule import StoppingRule

__all__ = ["Verdict", "SweepWatcher"]


@dataclass
class Verdict:
    """One run's state at one pass of the watcher."""

    run: str
    checkpoints: int
    p_sufficient: float | None
    verdict: str  # "stop", "continue", "wait" (nothing to decide from yet), "finished", "failed"
    final_accuracy: float | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "checkpoints": self.checkpoints,
            "p_sufficient": self.p_sufficient,
            "verdict": self.verdict,
            "final_accuracy": self.final_accuracy,
            "error": self.error,
        }


@dataclass
class _Seen:
    files: list = field(default_factory=list)
    records: list = field(default_factory=list)
    history: list = field(default_factory=list)


class SweepWatcher:
    """Verdicts for every run of a sweep folder, recomputed incrementally at each [`poll`][dtg_gpu.workflow.watch.SweepWatcher.poll].

    Parameters
    ----------
    sweep : path
        A `dtg sweep` folder (`sweep.json`), or any folder of run folders (then pass
        `model`).
    rule : StoppingRule, optional
        Default: `StoppingRule()` (online learning from the finished runs).
    model : torch.nn.Module, optional
        The runs' architecture; default: built from `run.json`/`sweep.json`.
    device : optional
    """

    def __init__(
        self,
        sweep: str | os.PathLike,
        rule: StoppingRule | None = None,
        model: torch.nn.Module | None = None,
        device=None,
    ) -> None:
        self.sweep = Path(sweep)
        if not self.sweep.is_dir():
            raise FileNotFoundError(f"{self.sweep}: sweep folder not found")
        self.rule = rule or StoppingRule()
        self.model = model
        self.device = device
        self._seen: dict[str, _Seen] = {}
        self._grid: dict[str, dict] | None = None  # run name -> its point of sweep.json's grid

    # --------------------------------------------------------------- the folder
    def run_folders(self) -> list[Path]:
        """The run folders: those `sweep.json` lists (in grid order), else every subfolder."""
        from dtg_gpu.core.files import confined_path
        from dtg_gpu.io.manifest import read_manifest

        manifest = self.sweep / "sweep.json"
        if manifest.is_file():
            meta = read_manifest(manifest)
            names = meta.get("runs") if isinstance(meta, dict) else None
            if isinstance(names, list):
                return [confined_path(self.sweep, n, what=f"{manifest}: runs[{i}]") for i, n in enumerate(names)]
        return sorted(
            (d for d in self.sweep.iterdir() if d.is_dir() and not d.name.startswith(".")), key=lambda d: d.name
        )

    def _sweep_model(self) -> torch.nn.Module:
        """The model of a `dtg sweep` folder, from `sweep.json` (runs still training have no
        `run.json` yet)."""
        from dtg_gpu.exceptions import CheckpointError
        from dtg_gpu.io.manifest import read_manifest
        from dtg_gpu.models import build_model
        from dtg_gpu.sweeps.data import dataset_shape

        manifest = self.sweep / "sweep.json"
        cfg = read_manifest(manifest).get("config", {}) if manifest.is_file() else {}
        if not isinstance(cfg, dict) or "model" not in cfg:
            raise CheckpointError(f"{self.sweep}: no sweep.json naming the model; pass model=")
        classes, channels = dataset_shape(str(cfg.get("dataset", ""))) or (10, 3)
        kwargs = {"num_classes": classes, "in_channels": channels, **(cfg.get("model_kwargs") or {})}
        with torch.device("meta"):
            return build_model(cfg["model"], **kwargs)

    def _run_of(self, folder: Path):
        """`(Run, finished)` for one folder; a folder with no checkpoint yet gives `(None, False)`."""
        from dtg_gpu.io.folders import scan_checkpoints
        from dtg_gpu.io.manifest import run_state
        from dtg_gpu.io.run import Run

        state = run_state(folder)
        if state == "complete":
            return Run.from_dir(folder, model=self.model), True
        if state != "unfinished":
            from dtg_gpu.exceptions import CheckpointError

            raise CheckpointError(state)
        files = scan_checkpoints(folder) if folder.is_dir() else []
        if not files:
            return None, False
        if self.model is None:
            self.model = self._sweep_model()
        return Run(model=self.model, checkpoints=files, name=folder.name), False

    def _params(self, name: str, run) -> dict:
        """A run's hyper-parameters, for the rule's `covariates`: the grid point `sweep.json`
        gives it (a run still training has no run.json yet); for named covariates, its run.json
        over that point. `"auto"` reads the grid point alone: run.json also holds the run's
        results (`final_accuracy`), which are not hyper-parameters."""
        if not self.rule.covariates:
            return {}
        if self._grid is None:
            from dtg_gpu.core.failures import READ_ERRORS
            from dtg_gpu.io.manifest import read_manifest
            from dtg_gpu.sweeps.state import sweep_grid

            self._grid = {}
            manifest = self.sweep / "sweep.json"
            try:
                meta = read_manifest(manifest) if manifest.is_file() else None
            except READ_ERRORS:
                meta = None
            names = meta.get("runs") if isinstance(meta, dict) else None
            made = sweep_grid(meta)
            if made is not None and isinstance(names, list) and len(names) == len(made[1]):
                self._grid = dict(zip(map(str, names), made[1]))
        point = dict(self._grid.get(name, {}))
        if self.rule.covariates == "auto":
            return point
        meta = run.meta if isinstance(getattr(run, "meta", None), dict) else {}
        return {**point, **meta}

    # ------------------------------------------------------------------- a pass
    @staticmethod
    def _identity(path: Any) -> tuple:
        """A checkpoint as the watcher knows it: path, size, mtime and inode (a run restarted
        into its folder writes new files under the old names)."""
        try:
            st = os.stat(path)
            return (str(path), st.st_size, st.st_mtime_ns, st.st_ino)
        except OSError:
            return (str(path), None, None, None)

    def _read_new(self, run, seen: _Seen, files: list) -> str | None:
        """Summarise the checkpoints after those seen, up to the first that cannot be read
        (a half-written file of a training loop that does not write atomically); returns
        that one's error, and the next pass tries it again."""
        from dtg_gpu.core.failures import READ_ERRORS
        from dtg_gpu.io.run import Run

        start = len(seen.files)
        try:
            seen.records += run_records(run, device=self.device, start=start)
            seen.files = files
            return None
        except READ_ERRORS as exc:
            error = str(exc)
        for i in range(start, len(files)):  # one at a time: keep what is readable
            part = Run(
                model=run.model,
                checkpoints=list(run.checkpoints)[: i + 1],
                name=run.name,
                prefix=run.prefix,
                fallback=run.fallback,
            )
            try:
                seen.records += run_records(part, device=self.device, start=i)
            except READ_ERRORS as exc:
                return str(exc)
            seen.files = files[: i + 1]
        return error

    def poll(self) -> list[Verdict]:
        """One pass over the sweep: summarise new checkpoints, then judge every run.

        A finished run whose checkpoints cannot be read is `"failed"`; a running one is
        judged from the checkpoints read so far (an unreadable newest file is tried again
        at the next pass, its error kept in `Verdict.error`)."""
        from dtg_gpu.core.failures import READ_ERRORS

        runs: dict[str, tuple] = {}
        out: dict[str, Verdict] = {}
        errors: dict[str, str] = {}
        folders = self.run_folders()
        pending: list[tuple[str, Any, bool, _Seen, list]] = []
        for folder in folders:
            name = folder.name
            try:
                run, finished = self._run_of(folder)
                if run is None:
                    out[name] = Verdict(name, 0, None, "wait")
                    continue
                seen = self._seen.setdefault(name, _Seen())
                files = [self._identity(c) for c in run.checkpoints]
                if files[: len(seen.files)] != seen.files:  # rewritten or restarted: start over
                    seen.files, seen.records, seen.history = [], [], []
                runs[name] = (run, finished, seen)
                if len(files) > len(seen.files):
                    pending.append((name, run, finished, seen, files))
            except READ_ERRORS as exc:
                out[name] = Verdict(name, 0, None, "failed", error=str(exc))
        # the new checkpoints of every run at once (one batch per architecture and count);
        # a run whose batch failed is read one checkpoint at a time, to keep what is readable
        made = many_run_records(
            [p[1] for p in pending],
            [len(p[3].files) for p in pending],
            device=self.device,
            weight_stats=self.rule.needs_weight_stats,
        )
        for (name, run, finished, seen, files), recs in zip(pending, made):
            if isinstance(recs, list):
                seen.records += recs
                seen.files = files
                continue
            error = self._read_new(run, seen, files)
            if error is not None:
                if finished:
                    runs.pop(name)
                    out[name] = Verdict(name, 0, None, "failed", error=error)
                else:
                    errors[name] = error
        finished = [
            (n, s.records, None, r.final_accuracy, self._params(n, r))
            for n, (r, f, s) in runs.items()
            if f and r.final_accuracy is not None
        ]
        for name, (run, fin, seen) in runs.items():
            k = len(seen.records)
            if fin:
                out[name] = Verdict(name, k, None, "finished", final_accuracy=run.final_accuracy)
                continue
            try:
                while len(seen.history) < k:  # one probability per checkpoint, judged when it lands
                    j = len(seen.history) + 1
                    peers = [(n, s.records, None) for n, (_, f, s) in runs.items() if n != name and not f]
                    seen.history.append(
                        self.rule.probability(seen.records[:j], None, finished, peers, params=self._params(name, run))
                    )
            except ValueError as exc:  # a given predictor that does not fit this run
                out[name] = Verdict(name, k, None, "failed", error=str(exc))
                continue
            p = seen.history[-1] if seen.history else None
            stop = self.rule.should_stop(seen.history, diverged=is_diverged(seen.records))
            verdict = "stop" if stop else ("wait" if p is None else "continue")
            out[name] = Verdict(name, k, p, verdict, error=errors.get(name))
        return [out[f.name] for f in folders if f.name in out]

    def watch(self, interval: float = 30.0, once: bool = False) -> Iterator[list[Verdict]]:
        """[`poll`][dtg_gpu.workflow.watch.SweepWatcher.poll] every `interval` seconds until every run is finished (or once).

        Raises
        ------
        ValueError
            `interval` is not a number of seconds in (0, 7 days].
        """
        import time

        check_interval(interval)
        while True:
            verdicts = self.poll()
            yield verdicts
            if once or (verdicts and all(v.verdict in ("finished", "failed") for v in verdicts)):
                return
            time.sleep(interval)


MAX_INTERVAL_S = 7 * 24 * 3600


def check_interval(interval: Any, what: str = "interval") -> float:
    """A polling interval in seconds: a finite number in (0, 7 days]."""
    ok = is_number(interval) and math.isfinite(interval)
    if not (ok and 0 < interval <= MAX_INTERVAL_S):
        raise ValueError(f"{what} must be a number of seconds in (0, {MAX_INTERVAL_S}] (7 days), got {interval!r}")
    return float(interval)
