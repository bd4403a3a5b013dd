"""Encoder weights: where they are, how to read them, what they hash to (DESIGN.md section 4).

:func:`resolve_weights` looks, in order, at an explicit ``weights=`` path, at
``$CRSREPRO_WEIGHTS/<encoder id>/``, and at the offline Hugging Face cache (``local_files_only``) for
``spec.hf_repo`` at ``spec.hf_revision``. Nothing is ever downloaded. Checkpoints are read safely
(:func:`load_state_dict`: safetensors, or ``torch.load(weights_only=True)`` with exactly one extra class
allowed, ``argparse.Namespace``, which MAE-style checkpoints carry as ``args``).

Two errors tell a user what to fix: :class:`~crsrepro.core.errors.MissingWeightsError` when the weights
are not where we looked, :class:`~crsrepro.core.errors.WrongWeightsError` when a file is there but is not
the released one (unreadable, another MD5, or a checkpoint that does not fit the network).

This module sits below the registry (:mod:`crsrepro.encoders.registry`, whose ``Encoder`` hashes its
weights with :func:`weights_hash`) and imports nothing from it: a ``spec`` argument is an
:class:`~crsrepro.encoders.registry.EncoderSpec`, of which only ``id``, ``weight_files``, ``weight_md5``,
``hf_repo`` and ``hf_revision`` are read. The family loaders (:mod:`~crsrepro.encoders.timm_family` and
the others) build on these functions.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Sequence

import torch

from crsrepro.core.errors import MissingWeightsError, WrongWeightsError
from crsrepro.core.io import sha256_file

SAFE_CHECKPOINT_GLOBALS = (argparse.Namespace,)  # the ``args`` entry of MAE-style checkpoints


def resolve_weights(spec, weights: str | os.PathLike | None = None) -> Path:
    """The file or folder that holds ``spec``'s weights; never downloads.

    Looks at ``weights`` (overrides all), then ``$CRSREPRO_WEIGHTS/<spec.id>/``, then the offline
    Hugging Face cache for ``spec.hf_repo`` at ``spec.hf_revision`` (``local_files_only=True``; the
    cache's ``models--org--name/snapshots/<commit>/`` folder that the revision's ref points to).

    Raises
    ------
    MissingWeightsError
        Naming every place looked at and the files expected there.
    """
    expected = " or ".join(spec.weight_files) or "the weight files"
    if weights is not None:
        path = Path(weights).expanduser()
        if not path.exists():
            raise MissingWeightsError(f"{spec.id}: weights path {path} does not exist (expected {expected})")
        return path
    looked = []
    root = os.environ.get("CRSREPRO_WEIGHTS")
    if root:
        folder = Path(root).expanduser() / spec.id
        if folder.is_dir():
            return folder
        looked.append(str(folder))
    else:
        looked.append("$CRSREPRO_WEIGHTS/<id>/ (CRSREPRO_WEIGHTS is not set)")
    if spec.hf_repo:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
        revision = spec.hf_revision or "main"
        try:
            return Path(snapshot_download(spec.hf_repo, revision=revision, local_files_only=True))
        except LocalEntryNotFoundError:
            looked.append(f"the offline Hugging Face cache for {spec.hf_repo} (revision {revision})")
    raise MissingWeightsError(f"{spec.id}: no weights found; looked in {'; '.join(looked)}; "
                              f"expected {expected}")


def resolve_weights_folder(spec, weights: str | os.PathLike | None = None) -> Path:
    """:func:`resolve_weights`, as the folder (a file given as ``weights`` stands for its folder)."""
    path = resolve_weights(spec, weights)
    return path.parent if path.is_file() else path


def load_weights_strictly(spec, module: torch.nn.Module, state_dict: dict, *, source: Path,
                          what: str) -> None:
    """Load ``state_dict`` into ``module``; a tensor of the wrong shape, or any missing or unexpected key,
    raises WrongWeightsError.

    A checkpoint that only half-fits is the wrong checkpoint; ``what`` names the architecture in the message.
    """
    expected = module.state_dict()
    wrong = [k for k, v in state_dict.items()
             if k in expected and tuple(getattr(v, "shape", ())) != tuple(expected[k].shape)]
    if wrong:  # torch would raise a bare RuntimeError
        k = wrong[0]
        raise WrongWeightsError(f"{spec.id}: {source} does not fit {what}: {len(wrong)} tensors of the wrong shape "
                                f"(e.g. {k}: {tuple(state_dict[k].shape)} in the file, {tuple(expected[k].shape)} "
                                f"in the network)")
    missing, unexpected = module.load_state_dict(state_dict, strict=False)
    if missing or unexpected or not state_dict:
        raise WrongWeightsError(
            f"{spec.id}: {source} does not fit {what}: {len(missing)} missing keys (e.g. {missing[:3]}), "
            f"{len(unexpected)} unexpected (e.g. {unexpected[:3]})")


def find_weight_file(spec, path: Path, names: Sequence[str] | None = None) -> Path:
    """The first of ``names`` (default ``spec.weight_files``) inside folder ``path``, or ``path`` itself."""
    if path.is_file():
        return path
    names = spec.weight_files if names is None else names
    for name in names:
        if (path / name).is_file():
            return path / name
    raise MissingWeightsError(f"{spec.id}: none of {', '.join(names)} in {path}")


def load_state_dict(path: str | os.PathLike) -> dict:
    """Read a checkpoint safely: safetensors, or ``torch.load(weights_only=True)`` (no arbitrary pickle).

    Released ``.pth`` files often wrap the state dict (``{'model': ...}``, ``{'state_dict': ...}``);
    the wrapper is returned as is, and the family loader picks its key. MAE-style checkpoints (RETFound)
    also carry their training arguments as an ``argparse.Namespace`` under ``args``: that one class is
    allowed (:data:`SAFE_CHECKPOINT_GLOBALS`, through ``torch.serialization.safe_globals``), every other
    Python object is refused.

    Raises
    ------
    WrongWeightsError
        The file asks for another Python object (named in the message), or is not a checkpoint.
    """
    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file
        return load_file(str(path))
    try:
        with torch.serialization.safe_globals(list(SAFE_CHECKPOINT_GLOBALS)):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # an unpicklable object or a corrupt file: refuse, say which
        asked = re.search(r"GLOBAL (\S+)", str(err))
        reason = (f"it asks for the Python object {asked.group(1)}; only tensors, containers and "
                  f"argparse.Namespace are allowed" if asked else str(err).splitlines()[0])
        raise WrongWeightsError(f"{path}: not a readable weights-only checkpoint: {reason} (re-save its "
                                f"state dict with torch.save or as .safetensors)") from err


def md5_of(path: Path) -> str:
    """The MD5 of a file (as releases such as hi-ml's BioViL document theirs)."""
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_md5(spec, path: Path) -> None:
    """Refuse ``path`` if ``spec.weight_md5`` is set and the file's MD5 differs."""
    if spec.weight_md5 is not None and md5_of(path) != spec.weight_md5:
        raise WrongWeightsError(f"{spec.id}: {path} has MD5 {md5_of(path)}, but the release documents "
                                f"{spec.weight_md5}; this is not the released file")


_HASH_CACHE: dict[tuple[str, int, int], str] = {}


def _cached_sha256(path: Path) -> str:
    """:func:`crsrepro.core.io.sha256_file` of ``path``, remembered by (resolved path, size, mtime) for
    the process: a multi-GB weight file is read once, however many encoders hash it."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _HASH_CACHE:
        _HASH_CACHE[key] = sha256_file(path)
    return _HASH_CACHE[key]


def weights_hash(path: str | os.PathLike | Sequence[str | os.PathLike]) -> str:
    """SHA-256 of a weight file, of a list of files (the files a builder read), or of a whole folder.

    A single file hashes to its own SHA-256 (what the Hugging Face hub shows for an LFS file); a list
    hashes its files' names and digests, in the order given; a folder hashes every file in it with its
    relative name (only for encoders that do not say which files they read: the paper builders do).
    Per-file digests are cached by (path, size, mtime), so repeated calls are cheap.
    """
    if not isinstance(path, (str, os.PathLike)):
        files = [Path(p) for p in path]
        names = [p.name for p in files]
        if not files:
            raise MissingWeightsError("weights_hash needs at least one file")
    else:
        path = Path(path)
        if path.is_file():
            return _cached_sha256(path)
        files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
        names = [p.relative_to(path).as_posix() for p in files]
        if not files:
            raise MissingWeightsError(f"weights folder {path} holds no files")
    digest = hashlib.sha256()
    for name, p in zip(names, files):
        digest.update(f"{name}\0{_cached_sha256(p)}\n".encode())
    return digest.hexdigest()


def state_dict_hash(module: torch.nn.Module) -> str:
    """SHA-256 of a module's parameters and buffers (for models built without a weight file, and for
    MedGemma's tower, whose tensors come out of multi-GB shards)."""
    digest = hashlib.sha256()
    for name, tensor in module.state_dict().items():
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{t.dtype}:{tuple(t.shape)}\n".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def read_json(path: Path) -> dict:
    """A JSON file as a dict ({} when it does not exist)."""
    return json.loads(path.read_text()) if path.is_file() else {}
