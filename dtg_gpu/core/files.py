r"""Writing files so that a crash never leaves a half-written one, and reading paths that
untrusted manifests name without leaving their folder.

Every file the project writes goes through `atomic_write`: the bytes go to a fresh
temporary name in the same folder (unique per process, created `0600` by `mkstemp`),
are flushed and `fsync`-ed, get the permissions a plain `open` would give under the
process's umask, and are renamed over the target; the folder is `fsync`-ed too. A reader
sees the old file or the new one, never a prefix, and two writers never share a temporary.

What the path *is* is kept: a symbolic link is written through (its target gets the new
content, the link stays a link); a FIFO or a character device (`/dev/null`, a terminal) is
written directly, since it cannot be replaced; any other special file and a folder are
refused with one line. A temporary name never exceeds the file system's name limit, so a
legal long name is written too.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Union

from dtg_gpu.exceptions import CheckpointError

__all__ = ["atomic_write", "check_target", "confined_path"]

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


def _target(path: Path) -> tuple[Path, os.stat_result | None]:
    """The file a write to `path` lands in (a symlink's final target) and its status."""
    if str(path) in ("", "."):
        raise ValueError(f"{str(path)!r} is not a file name; name the file to write")
    try:
        target = Path(os.path.realpath(path)) if path.is_symlink() else path
        st = os.stat(target)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise OSError(
                errno.ENAMETOOLONG, f"{path.name[:40]}...: the name is longer than the file system allows"
            ) from None
        raise
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(f"{path}: is a folder; name a file inside it to write")
    if st is not None and not (stat.S_ISREG(st.st_mode) or stat.S_ISFIFO(st.st_mode) or stat.S_ISCHR(st.st_mode)):
        raise OSError(f"{path}: a special file (not a regular file, FIFO or character device); refusing to write it")
    return target, st


def _name_max(folder: Path) -> int:
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (OSError, ValueError, AttributeError):
        return 255


def _temp_prefix(name: str, suffix: str, folder: Path) -> str:
    """`.NAME.` for the temporary of `name`, shortened to fit the name limit with the 8
    random characters, `.tmp` and the suffix that `mkstemp` adds."""
    room = _name_max(folder) - len(f"..12345678.tmp{suffix}".encode())
    if len(name.encode()) <= room:
        return f".{name}."
    cut = name.encode()[: max(1, room - 1)].decode("utf-8", "ignore")
    return f".{cut}~."


def check_target(path: str | os.PathLike, *, what: str = "--out") -> Path:
    """Check, before any work, that `path` can be written by `atomic_write`: a file
    name (not empty, not a folder, not a special file) in a folder that exists.

    Raises
    ------
    FileNotFoundError, IsADirectoryError, OSError, ValueError
        One line naming `what` and the path.
    """
    path = Path(path)
    try:
        target, _ = _target(path)
    except (OSError, ValueError) as exc:
        raise type(exc)(f"{what}: {exc}") from None
    if len(target.name.encode()) > _name_max(target.parent if target.parent.is_dir() else Path(".")):
        raise OSError(f"{what}: {target.name[:40]}...: the name is longer than the file system allows")
    if not target.parent.is_dir():
        raise FileNotFoundError(f"{what}: {target.parent}: folder does not exist (for {path})")
    return target


def _write_direct(target: Path, data: Data) -> None:
    """A FIFO or character device: written in place (it cannot be renamed over)."""
    with open(target, "wb") as out:
        if callable(data):
            with tempfile.TemporaryDirectory(prefix="dtg-") as tmpdir:
                tmp = Path(tmpdir) / f"out{target.suffix}"
                data(tmp)
                with open(tmp, "rb") as src:
                    shutil.copyfileobj(src, out)
        else:
            out.write(data.encode("utf-8") if isinstance(data, str) else bytes(data))


def atomic_write(path: str | os.PathLike, data: Data, *, mode: int = 0o666) -> Path:
    r"""Write `data` to `path` through a temporary name and a rename.

    Parameters
    ----------
    path : path-like
        The target. Its folder must exist. A symbolic link is written through to its
        target; a FIFO or character device is written directly.
    data : str, bytes or callable
        The content (`str` is written as UTF-8), or `write(tmp_path)` that writes the
        temporary file itself (`safetensors.save_file`, `DataFrame.to_csv`, ...). The
        temporary keeps `path`'s suffix, so writers that infer a format from it work.
    mode : int, default 0o666
        Permissions before the umask, as for `open`.

    Returns
    -------
    Path

    Raises
    ------
    FileNotFoundError
        The folder of `path` does not exist (the message names it).
    IsADirectoryError
        `path` is a folder.
    OSError
        `path` is a special file other than a FIFO or character device, or the write
        failed (disk full, file size limit): the temporary is removed and any previous file
        at `path` is left as it was.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "x.json"
    >>> atomic_write(p, '{"a": 1}').read_text()
    '{"a": 1}'
    """
    path = Path(path)
    target, st = _target(path)
    if st is not None and not stat.S_ISREG(st.st_mode):
        _write_direct(target, data)
        return path
    folder = target.parent
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: folder does not exist (cannot write {path.name})")
    prefix = _temp_prefix(target.name, target.suffix, folder)
    fd, tmp_name = tempfile.mkstemp(prefix=prefix, suffix=f".tmp{target.suffix}", dir=folder)
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
        os.replace(tmp, target)
    except BaseException as exc:
        try:
            tmp.unlink()
        except OSError:
            pass
        if isinstance(exc, OSError) or type(exc).__name__ == "SafetensorError":  # disk full, size limit
            code = getattr(exc, "errno", None) or errno.EIO
            why = getattr(exc, "strerror", None) or " ".join(str(exc).split()) or type(exc).__name__
            raise OSError(code, f"{path}: cannot be written ({why}); the previous file, if any, is unchanged") from None
        raise
    _fsync_dir(folder)
    return path


def confined_path(folder: str | os.PathLike, name: object, *, what: str) -> Path:
    """`folder / name` for a `name` read from an untrusted manifest, refused unless it
    stays inside `folder` once resolved (absolute paths, `..` and symlinks that lead
    out are refused).

    Raises
    ------
    CheckpointError
        `name` is not a non-empty relative path string, or it leads outside `folder`;
        the message names `what` (the manifest and field) and the value, never whether a
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
