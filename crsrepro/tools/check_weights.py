"""``crsrepro check-weights``: does each paper encoder's local checkpoint load as released? (DESIGN.md section 14)

What a user runs on their own files before a GPU-day. For each paper encoder (or one), on the CPU and
never downloading, :func:`check_encoder` reports

- whether the weights were found, and where (or every place looked at: :func:`resolve_weights`);
- the weight file's top-level entries (tensors grouped by key prefix; any non-tensor entry, such as
  an ``args`` Namespace, with its type), read safely;
- the strict-load result (:func:`create_encoder`: every encoder key must fit);
- the parameter count of the built network against ``spec.n_params`` (the real checkpoint's);
- the shape and L2 norm of the ``final`` embedding of one fixed synthetic, non-square image.

An encoder passes when its weights load strictly with the spec's parameter count. Weights that are not
found are reported and do not fail the check (most users hold only some of the 15).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from crsrepro.core.errors import CrsreproError, MissingWeightsError
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


def check_encoder(encoder_id: str, *, weights=None) -> CheckResult:
    """Check one paper encoder's local weights on the CPU (see the module docstring)."""
    spec = get_encoder_spec(encoder_id)
    result = CheckResult(encoder_id)
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


def check_weights(encoder_ids=None, *, weights=None, out=print) -> list[CheckResult]:
    """Check ``encoder_ids`` (default: the 15 paper encoders), printing each report through ``out``.

    Raises
    ------
    CrsreproError
        An id that is not a paper encoder, or ``weights`` given for more than one encoder.
    """
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
    out(f"{len(found)} of {len(results)} found; {sum(r.passed for r in found)} of {len(found)} found load strictly "
        f"with the spec's parameter count")
    return results
