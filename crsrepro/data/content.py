"""What the images of a dataset are, as a key (DESIGN.md section 5): the feature cache's guard
against serving features of images that have changed under the same ids.

- A demo-world dataset is a pure function of the generator's version and parameters
  (:func:`crsrepro.data.demo_world.world_params`), so those are its key: changing
  ``demo_world.image_size`` or bumping the generator's version changes every demo feature key.
- A real release is keyed by its image files' contents: the list, in the table's order, of each
  file's path relative to the dataset's root (``<data.root>/<dataset>``) and the SHA-256 of its
  bytes. So the same files give the same key on any machine and in any folder (a copy, CI's copy of
  the shared images, a user's download), whatever their modification times, and two files with the
  same name in different studies (CheXpert's and MIMIC's ``view1_frontal.jpg``) are told apart.
  Reading every byte of a release takes long (minutes for CheXpert), so each file's digest is
  cached by (absolute path, size, modification time) **[ours]** in
  ``<features.cache_dir>/file_digests/`` (:func:`file_digests`): it is computed once, and a
  re-downloaded, converted or replaced file, which changes its size or mtime, is hashed again.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pandas as pd

from crsrepro.core.io import atomic_write, content_key, sha256_file

logger = logging.getLogger(__name__)

#: The folder, under the profile's feature cache, that holds the per-file digest caches.
DIGESTS_FOLDER = "file_digests"


def dataset_content_key(profile, dataset: str, images: pd.DataFrame) -> str:
    """The content key of ``images`` (columns ``image_id`` and ``path``) of ``dataset`` under ``profile``."""
    if profile.data.source == "demo_world" and dataset in profile.demo_world.n_images:
        from crsrepro.data.demo_world import world_params

        world = profile.demo_world
        return content_key(dataset=dataset, demo_world=world_params(n_images=world.n_images,
                                                                    image_size=world.image_size, seed=world.seed))
    root = profile.dataset_root(dataset)
    paths = images["path"].astype(str).tolist()
    digests = file_digests(paths, cache=profile.feature_cache_path / DIGESTS_FOLDER / f"{dataset}.json")
    files = [(Path(os.path.relpath(p, root)).as_posix(), digests[p]) for p in paths]
    return content_key(dataset=dataset, files=files)


def file_digests(paths: list[str], *, cache: Path) -> dict[str, str]:
    """The SHA-256 of each file of ``paths``, by path, cached in the JSON file ``cache``.

    ``cache`` maps a file's absolute path to ``[size, mtime_ns, sha256]``; an entry is used only while
    the file's size and modification time are the ones recorded, and the files hashed here are added
    to it (written atomically; when two processes add at once, the later write wins and the other's
    new entries are simply hashed again next time). An unreadable cache is logged and rebuilt.
    """
    cache = Path(cache)
    known = {}
    if cache.is_file():
        try:
            known = json.loads(cache.read_text())
        except (OSError, ValueError) as exc:
            logger.warning("%s: unreadable file-digest cache (%s); the files are hashed again", cache, exc)
    out, hashed = {}, 0
    for path in paths:
        absolute = os.path.abspath(path)
        st = os.stat(absolute)
        entry = known.get(absolute)
        if not (isinstance(entry, list) and entry[:2] == [st.st_size, st.st_mtime_ns]):
            entry = known[absolute] = [st.st_size, st.st_mtime_ns, sha256_file(absolute)]
            hashed += 1
        out[path] = entry[2]
    if hashed:
        logger.info("%s: hashed %d of %d image files (the rest were cached)", cache, hashed, len(paths))
        atomic_write(cache, json.dumps(known, sort_keys=True).encode())
    return out
