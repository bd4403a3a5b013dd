"""The package's one I/O layer: content keys, file hashes, atomic writes and the git hash.

Every cache and store of crsrepro (features, row-sets, per-case probabilities, split manifests, CRS
reference frames) writes through :func:`atomic_write`, names its entries with :func:`content_key`, and
records the commit with :func:`git_hash`. Keeping them in one module means one definition of each:

- :func:`content_key` is the SHA-256 of the canonical JSON of its inputs (sorted keys), so a key is a
  function of what went in and of nothing else;
- :func:`sha256_file` hashes a file's bytes in blocks;
- :func:`atomic_write` writes to a temporary file in the same folder, flushes and fsyncs it, and renames
  it over the target (``os.replace``), removing the temporary file on any failure: a reader sees the
  old file or the new one, never half of one. The file gets the mode any program's new file gets
  (0666 less the process umask: 0644 under umask 022), not ``mkstemp``'s private 0600, so a shared
  ``CRSREPRO_HOME`` is readable by the group; an OS error names the file it failed on;
- :func:`git_hash` is ``<12 hex digits>`` of the checkout's HEAD, ``+dirty`` when tracked files are
  modified, or ``unknown`` outside a checkout.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Callable

import pandas as pd

PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # the crsrepro package


def content_key(**inputs) -> str:
    """The SHA-256 of ``inputs`` as canonical JSON (sorted keys): the address of a cached result.

    >>> content_key(a=1, b="x") == content_key(b="x", a=1)
    True
    >>> content_key(a=1) == content_key(a=2)
    False
    """
    blob = json.dumps(inputs, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    """The SHA-256 (hex) of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def folder_digest(path: str | os.PathLike, *, exclude: tuple[str, ...] = ("__pycache__",)) -> str:
    """The SHA-256 over the relative names and :func:`sha256_file` of every file under ``path`` (sorted),
    skipping folders named in ``exclude``; the digest of a missing folder is that of an empty one."""
    root = Path(path)
    digest = hashlib.sha256()
    files = sorted(p for p in root.rglob("*") if p.is_file() and not set(exclude) & set(p.relative_to(root).parts))
    for file in files:
        digest.update(f"{file.relative_to(root).as_posix()}:{sha256_file(file)}\n".encode())
    return digest.hexdigest()


def package_digest() -> str:
    """:func:`folder_digest` of the installed crsrepro package (code, profiles, spaces, demo weights): what
    a cache of an analysis keys on, beside its inputs, so that no cached page survives a code change."""
    return folder_digest(PACKAGE_ROOT)


def atomic_write(path: str | os.PathLike, data: bytes | Callable) -> Path:
    """Write ``data`` (bytes, or a function that writes to a binary file object) to ``path`` atomically.

    The bytes go to a temporary file beside ``path``, are flushed and fsynced, and the file is renamed
    onto ``path``. On any error the temporary file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~process_umask())
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.errno and exc.filename is None:  # a full disk names no file
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    return path


def computed_once(path: str | os.PathLike, compute: Callable):
    """The object pickled at ``path``, or ``compute()``'s result pickled there first.

    For an analysis that several chapters read, each in its own kernel and two side by side: the
    computation runs under an exclusive ``flock`` on ``<path>.lock``, so a second reader waits and then
    reads the first one's file instead of computing it again; the kernel releases the lock if its
    holder dies. ``path`` must name its inputs (a content key), since a file found there is returned
    as it is.
    """
    import fcntl
    import pickle

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.is_file():
            return pickle.loads(path.read_bytes())
        value = compute()
        atomic_write(path, pickle.dumps(value))
    return value


def process_umask() -> int:
    """The process umask, read without changing it where Linux shows it (``/proc/self/status``), else
    by setting and restoring it."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_parquet(df: pd.DataFrame, path: str | os.PathLike) -> Path:
    """Write ``df`` (index dropped, ``attrs`` kept in the parquet metadata) to ``path`` atomically."""
    return atomic_write(path, lambda f: df.to_parquet(f, index=False))


def git_hash(path: str | os.PathLike | None = None) -> str:
    """The commit of the checkout holding ``path`` (default: this package), ``+dirty`` if tracked files
    are modified, ``unknown`` outside git."""
    cwd = Path(path) if path is not None else PACKAGE_ROOT
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=cwd, capture_output=True,
                              text=True, check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def manifest_dir(override: str | os.PathLike | None = None) -> Path:
    """Where frozen split manifests, CRS reference frames and the claims file live.

    The one rule for the whole package: ``override`` if given, else ``$CRSREPRO_MANIFESTS``, else the
    ``data_manifests/`` folder of the checkout this package was installed from (editable install),
    else ``./data_manifests``.
    """
    if override is not None:
        return Path(override).absolute()
    if os.environ.get("CRSREPRO_MANIFESTS"):
        return Path(os.environ["CRSREPRO_MANIFESTS"]).absolute()
    checkout = PACKAGE_ROOT.parent / "data_manifests"
    return checkout if checkout.is_dir() else Path.cwd().absolute() / "data_manifests"
