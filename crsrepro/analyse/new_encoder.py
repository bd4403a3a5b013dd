"""Scoring a newcomer against a profile's frozen reference frame (``crsrepro score``; DESIGN.md section 9).

The newcomer runs through the profile's grid (:func:`crsrepro.run.grid.run_grid` with only its encoder,
into its own results folder), its reliability profiles are scored against the frozen frame
(:func:`crsrepro.score.crs.score_encoder`), and the panel is neither recomputed nor moved.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from crsrepro.core.errors import CrsreproError
from crsrepro.profiles import Profile, as_profile
from crsrepro.run.grid import run_grid
from crsrepro.run.results import ResultStore, runs_table
from crsrepro.score.frame import reference_frame


def score_new_encoder(profile: Profile | str, encoder_id: str, *, weights=None, manifest_dir: Path | None = None,
                      progress: bool = True) -> pd.DataFrame:
    """Run a newcomer through the profile's grid and score it against the frozen frame (``crsrepro score``).

    The panel is not recomputed and its published scores do not move (the frame is fixed). The
    newcomer's results go to ``<output_dir>/newcomers/<encoder id>/``.

    Raises
    ------
    CrsreproError
        No frame is frozen, or the panel's results have changed since the frame was frozen from them.
    """
    from crsrepro.encoders import get_encoder_spec
    from crsrepro.score.crs import score_encoder
    from crsrepro.score.dimensions import reliability_profiles

    profile = as_profile(profile)
    get_encoder_spec(encoder_id)  # an unknown id fails here, before any work
    frame = reference_frame(profile, manifest_dir=manifest_dir)
    panel = ResultStore(profile.output_path).merged_path
    if panel.is_file():
        problem = frame.check_results(pd.read_parquet(panel).attrs.get("keys_hash"))
        if problem:
            raise CrsreproError(f"{problem}; re-freeze the frame (crsrepro freeze-frame --profile {profile.name} "
                                f"--overwrite) or restore the results it was frozen from")
    results = run_grid(profile, encoders=[encoder_id], weights={encoder_id: weights} if weights else None,
                       output_dir=profile.output_path / "newcomers" / encoder_id, manifest_dir=manifest_dir,
                       progress=progress)
    return score_encoder(reliability_profiles(runs_table(results)), frame)


__all__ = ["score_new_encoder"]
