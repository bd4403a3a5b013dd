"""What the images of a dataset are, as a key (DESIGN.md section 5): the feature cache's guard
against serving features of images that have changed under the same ids.

- A demo-world dataset is a pure function of the generator's version and parameters
  (:func:`crsrepro.data.demo_world.world_params`), so those are its key: changing
  ``demo_world.image_size`` or bumping the generator's version changes every demo feature key.
- A real release is keyed by the list of its image files with their sizes and modification times
  **[ours]**: reading every byte of 250,000 images to hash them would take longer than a run's
  extraction, while a re-downloaded, converted or replaced file changes its size or mtime. A user who
  edits images in place keeping both (unusual) must clear the feature cache.
"""

from __future__ import annotations

import os

import pandas as pd

from crsrepro.core.io import content_key


def dataset_content_key(profile, dataset: str, images: pd.DataFrame) -> str:
    """The content key of ``images`` (columns ``image_id`` and ``path``) of ``dataset`` under ``profile``."""
    if profile.data.source == "demo_world" and dataset in profile.demo_world.n_images:
        from crsrepro.data.demo_world import world_params

        world = profile.demo_world
        return content_key(dataset=dataset, demo_world=world_params(n_images=world.n_images,
                                                                    image_size=world.image_size, seed=world.seed))
    stats = []
    for path in images["path"].astype(str):
        st = os.stat(path)
        stats.append((os.path.basename(path), st.st_size, st.st_mtime_ns))
    return content_key(dataset=dataset, files=stats)
