r"""Writing files so that a crash never leaves a half-written one, and reading paths that
untrusted manifests name without leaving their folder.

Every file the project writes goes through :func:`atomic_write`: the bytes go to a fresh
temporary name in the same folder (unique per process, created ``0600`` by ``mkstemp``),
are flushed and ``fsync``-ed, get the permissions a plain ``open`` would give under the
process's umask, and are renamed over the target; the folder is ``fsync``-ed too. A reader
sees the old file or the new one, never a prefix, and two writers never share a temporary.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Union

from .exceptions import CheckpointError

__all__ = ["atomic_write", "confined_path"]

Data = Union[str, bytes, Callable[[Path], None]]


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, data: Data, *, mode: int = 0o666) -> Path:
    r"""Write ``data`` to ``path`` through a temporary name and a rename.

    Parameters
    ----------
    path : path-like
        The target. Its folder must exist.
    data : str, bytes or callable
        The content (``str`` is written as UTF-8), or ``write(tmp_path)`` that writes the
        temporary file itself (``safetensors.save_file``, ``DataFrame.to_csv``, ...). The
        temporary keeps ``path``'s suffix, so writers that infer a format from it work.
    mode : int, default 0o666
        Permissions before the umask, as for ``open``.

    Returns
    -------
    Path

    Raises
    ------
    FileNotFoundError
        The folder of ``path`` does not exist (the message names it).
    OSError
        The write failed (disk full, file size limit): the temporary is removed and any
        previous file at ``path`` is left as it was.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "x.json"
    >>> atomic_write(p, '{"a": 1}').read_text()
    '{"a": 1}'
    """
    path = Path(path)
    folder = path.parent
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: folder does not exist (cannot write {path.name})")
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=f".tmp{path.suffix}", dir=folder)
    tmp = Path(tmp_name)
    try:
        if callable(data):
            os.close(fd)
            data(tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        else:
            with os.fdopen(fd, "wb") as f:  # the temporary of the atomic write
                f.write(data.encode("utf-8") if isinstance(data, str) else bytes(data))
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, mode & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    _fsync_dir(folder)
    return path


def confined_path(folder: str | os.PathLike, name: object, *, what: str) -> Path:
    """``folder / name`` for a ``name`` read from an untrusted manifest, refused unless it
    stays inside ``folder`` once resolved (absolute paths, ``..`` and symlinks that lead
    out are refused).

    Raises
    ------
    CheckpointError
        ``name`` is not a non-empty relative path string, or it leads outside ``folder``;
        the message names ``what`` (the manifest and field) and the value, never whether a
        file exists there.
    """
    folder = Path(folder)
    if not isinstance(name, str) or not name or "\x00" in name:
        raise CheckpointError(f"{what}: expected a file name inside {folder}, got {name!r}")
    if Path(name).is_absolute():
        raise CheckpointError(f"{what}: {name!r} is an absolute path; only names inside {folder} are read")
    base = folder.resolve()
    target = (folder / name).resolve()
    if target != base and base not in target.parents:
        raise CheckpointError(f"{what}: {name!r} leads outside {folder}; only names inside it are read")
    return folder / name
