"""``crsrepro check-weights``: does each paper encoder's local checkpoint load as released? (DESIGN.md section 14)

What a user runs on their own files before a GPU-day. For each paper encoder (or one), on the CPU and
never downloading, :func:`check_encoder` reports

- the release: where to get the checkpoint (the release's own instructions: a hub repository, a gated
  model and its terms, or the authors' Drive link), the pinned revision (or that it is unverified) and
  how it was chosen, and the licence (:data:`crsrepro.encoders.paper.PAPER_RELEASES`);
- whether the weights were found, and where (or every place looked at: :func:`resolve_weights`);
- the weight file's top-level entries (tensors grouped by key prefix; any non-tensor entry, such as
  an ``args`` Namespace, with its type), read safely;
- the strict-load result (:func:`create_encoder`: every encoder key must fit);
- the parameter count of the built network against ``spec.n_params`` (the real checkpoint's);
- the shape and L2 norm of the ``final`` embedding of one fixed synthetic, non-square image.

A summary table (one row per encoder) ends the output. An encoder passes when its weights load strictly
with the spec's parameter count. :func:`check_weights` raises after printing everything when an encoder
was found but does not pass, when an encoder asked for by id is not found, or, with ``require_all``
(``--all``), when any of the 15 is not found. Checking all 15 without ``require_all`` is a survey: encoders
not found are reported and do not fail (most users hold only some of the 15).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from crsrepro.core.errors import CrsreproError, MissingWeightsError, WrongWeightsError
from crsrepro.core.schema import FINAL
from crsrepro.encoders import create_encoder, get_encoder_spec, paper
from crsrepro.encoders.weights import find_weight_file, load_state_dict, resolve_weights

PAPER_IDS = tuple(spec.id for spec, _ in paper.PAPER_ENCODERS)


@dataclass
class CheckResult:
    """One encoder's check: ``found``, ``passed`` (loaded strictly with the spec's parameter count) and
    the report ``lines``."""

    encoder_id: str
    found: bool = False
    passed: bool = False
    lines: list[str] = field(default_factory=list)
    revision: str = "-"
    licence: str = ""

    def report(self) -> str:
        return "\n".join([self.encoder_id] + [f"  {line}" for line in self.lines])


def synthetic_image(height: int = 300, width: int = 400) -> torch.Tensor:
    """A fixed ``uint8 [1, 3, H, W]`` image (smooth colour ramps plus a checker), non-square on purpose
    so that the resize mode matters; the same bytes on every machine."""
    rows, cols = np.mgrid[0:height, 0:width]
    channels = [rows * 255 // (height - 1), cols * 255 // (width - 1), ((rows // 25 + cols // 25) % 2) * 255]
    return torch.from_numpy(np.stack(channels).astype(np.uint8))[None]


def _prefix_counts(keys) -> str:
    counts = Counter(k.split(".")[0] + (".*" if "." in k else "") for k in keys)
    return ", ".join(f"{name} ({n})" for name, n in counts.most_common())


def describe_checkpoint(path: Path) -> str:
    """The top-level entries of a weight file (or shard index), without loading a network."""
    if path.name.endswith(".index.json"):
        weight_map = json.loads(path.read_text())["weight_map"]
        shards = sorted(set(weight_map.values()))
        return f"{path.name}: {len(shards)} shards, {len(weight_map)} tensors: {_prefix_counts(weight_map)}"
    if path.suffix == ".safetensors":
        from safetensors import safe_open
        with safe_open(str(path), framework="pt") as f:
            keys = list(f.keys())
        return f"{path.name}: {len(keys)} tensors: {_prefix_counts(keys)}"
    checkpoint = load_state_dict(path)
    if all(isinstance(v, torch.Tensor) for v in checkpoint.values()):
        return f"{path.name}: a flat state dict, {len(checkpoint)} tensors: {_prefix_counts(checkpoint)}"
    entries = []
    for key, value in checkpoint.items():
        if isinstance(value, dict) and value and all(isinstance(v, torch.Tensor) for v in value.values()):
            entries.append(f"{key} ({len(value)} tensors: {_prefix_counts(value)})")
        elif isinstance(value, torch.Tensor):
            entries.append(f"{key} (tensor {tuple(value.shape)})")
        else:
            entries.append(f"{key} (non-tensor: {type(value).__name__})")
    return f"{path.name}: {len(checkpoint)} top-level entries: " + "; ".join(entries)


def revision_label(spec) -> str:
    """The pinned revision as the summary shows it: the commit (short), the tag, ``main (UNVERIFIED)``, or
    ``-`` for a checkpoint that is not on a hub."""
    if spec.hf_repo is None:
        return "-"
    if not paper.PAPER_RELEASES[spec.id].verified:
        return f"{spec.hf_revision} (UNVERIFIED)"
    return spec.hf_revision[:12]


def release_lines(spec) -> list[str]:
    """Where to get ``spec``'s checkpoint, on which terms, the revision to download and the licence."""
    release = paper.PAPER_RELEASES[spec.id]
    lines = [f"get: {release.source}", f"access: {release.access}"]
    if spec.hf_repo is not None:
        status = "pinned" if release.verified else "UNVERIFIED, follows the branch"
        lines += [f"revision: {spec.hf_revision} ({status})",
                  f"download: huggingface-cli download {spec.hf_repo} --revision {spec.hf_revision}"]
    else:
        lines.append("revision: none (not on a hub)")
    lines += [f"pin: {release.pin}", f"licence: {spec.licence}"]
    return lines


def summary_table(results) -> str:
    """One row per encoder: found, passed, the pinned revision and the licence."""
    rows = [("encoder", "found", "loads as released", "revision", "licence")]
    rows += [(r.encoder_id, "yes" if r.found else "NO", ("yes" if r.passed else "NO") if r.found else "-",
              r.revision, r.licence) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths)) + "  " + row[4] for row in rows)


def check_encoder(encoder_id: str, *, weights=None) -> CheckResult:
    """Check one paper encoder's local weights on the CPU (see the module docstring)."""
    spec = get_encoder_spec(encoder_id)
    result = CheckResult(encoder_id, revision=revision_label(spec), licence=spec.licence)
    result.lines.extend(release_lines(spec))
    try:
        where = resolve_weights(spec, weights)
    except MissingWeightsError as err:
        result.lines.append(f"weights: not found ({err})")
        return result
    result.found = True
    result.lines.append(f"weights: found at {where}")
    try:
        result.lines.append("file: " + describe_checkpoint(find_weight_file(spec, where)))
    except CrsreproError as err:
        result.lines.append(f"file: unreadable ({err})")
    try:
        encoder = create_encoder(encoder_id, weights=where, device="cpu")
    except CrsreproError as err:
        result.lines.append(f"strict load: FAILED ({err})")
        return result
    result.lines.append("strict load: ok (every key of the image encoder fits)")
    n_params = sum(p.numel() for p in encoder.model.parameters())
    matches = spec.n_params is not None and n_params == spec.n_params
    expected = f"{spec.n_params:,}" if spec.n_params is not None else "none given"
    result.lines.append(f"parameters: {n_params:,} (spec {expected}: {'matches' if matches else 'DIFFERS'})")
    final = encoder.forward_features(encoder.preprocess(synthetic_image()))[FINAL]
    result.lines.append(f"embedding: shape {tuple(final.shape)}, L2 norm {final.norm().item():.4f} "
                        f"(spec dimension {spec.embed_dim}) on the fixed synthetic image")
    result.passed = matches and final.shape[1] == spec.embed_dim
    return result


def check_weights(encoder_ids=None, *, require_all: bool = False, weights=None, out=print) -> list[CheckResult]:
    """Check ``encoder_ids`` (default: the 15 paper encoders), printing each report and then the summary
    table through ``out``.

    Parameters
    ----------
    encoder_ids : list of str, optional
        Paper encoder ids (``--encoder``); each must be found.
    require_all : bool
        ``--all``: check the 15, and every one must be found.
    weights : path, optional
        The weights of the one encoder in ``encoder_ids``.

    Raises
    ------
    MissingWeightsError
        After the report: an encoder asked for by id, or with ``require_all`` any of the 15, is not found.
    WrongWeightsError
        After the report: an encoder was found but does not load as released.
    CrsreproError
        An id that is not a paper encoder, ``weights`` given for more than one encoder, or ids together
        with ``require_all``.
    """
    if encoder_ids and require_all:
        raise CrsreproError("--all checks all 15 paper encoders; give it without --encoder")
    ids = list(encoder_ids or PAPER_IDS)
    for encoder_id in ids:
        get_encoder_spec(encoder_id)  # an unknown id: UnknownEncoderError with close matches
        if encoder_id not in PAPER_IDS:
            raise CrsreproError(f"check-weights checks the paper encoders ({', '.join(PAPER_IDS)}); "
                                f"{encoder_id!r} is not one")
    if weights is not None and len(ids) != 1:
        raise CrsreproError("--weights needs exactly one --encoder")
    results = []
    for encoder_id in ids:
        results.append(check_encoder(encoder_id, weights=weights))
        out(results[-1].report())
    found = [r for r in results if r.found]
    out(summary_table(results))
    out(f"{len(found)} of {len(results)} found; {sum(r.passed for r in found)} of {len(found)} found load strictly "
        f"with the spec's parameter count")
    failed = [r.encoder_id for r in found if not r.passed]
    if failed:
        raise WrongWeightsError(f"{len(failed)} encoder(s) found but not loaded as released: {', '.join(failed)}")
    missing = [r.encoder_id for r in results if not r.found]
    if missing and (encoder_ids or require_all):
        asked = "asked for" if encoder_ids else "of the 15 (--all)"
        raise MissingWeightsError(f"{len(missing)} encoder(s) {asked} not found: {', '.join(missing)}")
    return results
