"""A user's own encoder, from a spec file or a Python entry point, registered to be scored (DESIGN.md section 1, item 4).

``crsrepro score`` takes a newcomer in two ways; both end as an :class:`~crsrepro.encoders.registry.EncoderSpec`
and a builder in the registry (:func:`~crsrepro.encoders.registry.register_newcomer`, id ``user.<name>``),
so the newcomer runs through the panel's own extraction cache, perturbations, probes and scoring
(DESIGN.md sections 4-9), and its feature-cache keys are derived from its weights' bytes and its spec
(:func:`crsrepro.extract.features.feature_keys`: id, weights hash, preprocessing, pooling).

1. **A spec file** (:func:`load_spec_file`), YAML with the fields of a registry spec (DESIGN.md section 4)::

       name: my_vit                 # the id becomes user.my_vit (default: the file's name)
       builder: timm                # timm | open_clip | transformers | torchscript | demo
       family: general              # general | medical | specialist (default: general)
       architecture: vit_small_patch16_224
       weights: my_vit/             # file or folder; a relative path is read from the spec file's folder
       input_size: 224
       resize_mode: crop            # crop | pad
       interpolation: bicubic       # bicubic | bilinear
       mean: [0.485, 0.456, 0.406]
       std: [0.229, 0.224, 0.225]
       pooling: cls                 # cls | mean_patch | image_embed | gap
       licence: CC-BY-4.0
       embed_dim: 384               # optional: checked against what the network returns

   ``timm`` reads a hub-layout folder (``config.json`` with ``architecture`` and the ``model_args`` that
   shape the network, such as ``img_size``, + ``model.safetensors``) or a bare state-dict file of
   ``architecture`` at timm's defaults; ``open_clip`` a folder with ``open_clip_config.json``; ``transformers`` a
   ``save_pretrained`` folder (``architecture`` a class the package knows:
   :data:`crsrepro.encoders.transformers_family.ARCHITECTURES`); ``torchscript`` a file saved with
   ``torch.jit.save`` whose module maps ``[B, 3, S, S]`` to ``[B, D]`` (``pooling: image_embed``);
   ``demo`` one of the demo panel's architectures (``tiny_cnn``, ``efficientnet-lite0``, ...). Every
   error names the field.

2. **A Python entry point** ``package.module:build`` (or ``path/to/file.py:build``)
   (:func:`load_entry_point`): ``build()`` returns a ``torch.nn.Module`` mapping ``[B, 3, S, S]``
   floats to ``[B, D]``, or a pair ``(module, preprocessing)`` where ``preprocessing`` is a
   :class:`Preprocessing` or a dict of its fields. A bare module gets :data:`DEFAULT_PREPROCESSING`
   (224 px, ImageNet mean and std, bicubic, crop), and :attr:`Newcomer.defaults_used` says so.

Either way :func:`check_output` runs the built encoder on a fixed synthetic batch before any work and
refuses a network whose output is not ``[B, D]`` or holds a NaN or an infinity; :class:`UserEncoder`
checks every batch of the run the same way.

A spec that describes a member of the profile's panel (same builder, architecture, preprocessing,
pooling and weights' bytes) *is* that member (:func:`panel_twin`): it is scored under the member's id,
so its peers exclude itself as a newcomer's peers never do (DESIGN.md section 9), and its score equals
the member's published score.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import re
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import yaml

from crsrepro.core.errors import CrsreproError, MissingWeightsError, WrongWeightsError
from crsrepro.core.io import sha256_file
from crsrepro.core.schema import FINAL
from crsrepro.encoders.registry import (FAMILIES, IMAGENET_MEAN, IMAGENET_STD, INTERPOLATIONS, NEWCOMER_NAMESPACE,
                                        POOLINGS, RESIZE_MODES, Encoder, EncoderSpec, create_encoder,
                                        get_encoder_spec, list_encoders, register_newcomer)
from crsrepro.encoders.weights import state_dict_hash

BUILDERS = ("timm", "open_clip", "transformers", "torchscript", "demo")
"""The ``builder`` values of a spec file (a registry spec's ``loader``, plus ``torchscript``)."""
REQUIRED_FIELDS = ("builder", "architecture", "input_size", "interpolation", "mean", "std", "pooling", "licence")
OPTIONAL_FIELDS = ("name", "family", "weights", "resize_mode", "embed_dim", "pad_fill", "notes")
PROBE_BATCH = 2
"""Images in the synthetic batch :func:`check_output` runs (a fixed seed, so the check is repeatable)."""


class UserEncoderError(CrsreproError, ValueError):
    """A newcomer's spec file or entry point is invalid: an unknown or missing field (named), weights that
    are not there, or a network whose output is not a finite ``[B, D]`` embedding."""


@dataclass(frozen=True)
class Preprocessing:
    """What an entry point's network expects: the protocol ``build()`` may return beside its module.

    Images are read as RGB ``uint8``, resized as ``resize_mode`` says to ``input_size`` squares with
    ``interpolation`` (antialiased), scaled to [0, 1] and normalised with ``mean`` and ``std``
    (:func:`crsrepro.encoders.registry.resize_to_input`), exactly as for the panel.
    """

    input_size: int = 224
    mean: tuple = IMAGENET_MEAN
    std: tuple = IMAGENET_STD
    interpolation: str = "bicubic"
    resize_mode: str = "crop"


DEFAULT_PREPROCESSING = Preprocessing()
"""What a bare module gets: 224 px, ImageNet mean and std, bicubic, short side then centre crop."""


@dataclass(frozen=True)
class Newcomer:
    """A newcomer, registered and checked: what :func:`crsrepro.analyse.new_encoder.score_new_encoder` scores.

    Attributes
    ----------
    spec : EncoderSpec
        The registered spec (``user.<name>``, or the panel member's own when ``twin_of`` is set).
    source : str
        The spec file or the entry point it came from.
    weights : str or None
        The weights path given to the builder.
    weights_hash : str
        What the weights (and, for an entry point, its source file) hash to: part of every feature key.
    defaults_used : tuple of str
        The preprocessing fields that took :data:`DEFAULT_PREPROCESSING` (an entry point that returned a
        bare module, or a dict without them).
    twin_of : str or None
        The panel member this spec describes exactly (:func:`panel_twin`), scored under its id.
    """

    spec: EncoderSpec
    source: str
    weights: str | None
    weights_hash: str
    defaults_used: tuple = ()
    twin_of: str | None = None

    @property
    def id(self) -> str:
        return self.spec.id


# --------------------------------------------------------------------------- the encoder of a bare module

class UserEncoder(Encoder):
    """A ``torch.nn.Module`` mapping ``[B, 3, S, S]`` to ``[B, D]`` (an entry point's, or a TorchScript
    file's) behind the :class:`~crsrepro.encoders.registry.Encoder` contract, at the ``final`` tap only.

    ``source_file`` (an entry point's Python file) enters :attr:`weights_hash` beside the parameters, so
    an edited forward pass is never served the features of the old one.
    """

    def __init__(self, spec, model, *, device="cpu", weights_path=None, source_file: Path | None = None):
        super().__init__(spec, model, device=device, weights_path=weights_path)
        self.source_file = Path(source_file) if source_file is not None else None

    @property
    def weights_hash(self) -> str:
        if self.source_file is None:
            return super().weights_hash
        parts = f"{state_dict_hash(self.model)}\n{sha256_file(self.source_file)}"
        return hashlib.sha256(parts.encode()).hexdigest()

    def _forward_layers(self, x, layers):
        return {FINAL: checked_embedding(self.spec.id, self.model(x), len(x))}


def checked_embedding(encoder_id: str, out, n_images: int) -> torch.Tensor:
    """``out`` if it is a finite float ``[n_images, D]`` tensor, else :class:`UserEncoderError` saying what it is."""
    if not isinstance(out, torch.Tensor):
        raise UserEncoderError(f"{encoder_id}: the network returned a {type(out).__name__}, expected a tensor "
                               f"[B, D]")
    if out.ndim != 2 or out.shape[0] != n_images or out.shape[1] < 1:
        raise UserEncoderError(f"{encoder_id}: the network maps [{n_images}, 3, S, S] to {list(out.shape)}, "
                               f"expected [{n_images}, D] (pool or flatten it to one vector per image)")
    if not torch.isfinite(out).all():
        raise UserEncoderError(f"{encoder_id}: the embedding holds NaN or infinite values "
                               f"({int((~torch.isfinite(out)).sum())} of {out.numel()} entries)")
    return out


def check_output(encoder: Encoder) -> int:
    """Run ``encoder`` on a fixed synthetic ``uint8`` batch through its own preprocessing; return D.

    Raises
    ------
    UserEncoderError
        The network fails on the batch, or its ``final`` embedding is not a finite ``[B, D]``.
    """
    spec = encoder.spec
    rng = np.random.default_rng(0)
    side = max(spec.input_size, 32)
    batch = torch.from_numpy(rng.integers(0, 256, size=(PROBE_BATCH, 3, side, side), dtype=np.uint8))
    try:
        out = encoder.forward_features(encoder.preprocess(batch), layers=(FINAL,))[FINAL]
    except UserEncoderError:
        raise
    except (RuntimeError, ValueError, TypeError, IndexError) as exc:  # the user's network: say how it failed
        raise UserEncoderError(f"{spec.id}: the network fails on a [{PROBE_BATCH}, 3, {spec.input_size}, "
                               f"{spec.input_size}] batch: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                               ) from exc
    return int(checked_embedding(spec.id, out, PROBE_BATCH).shape[1])


# --------------------------------------------------------------------------- fields

def _field_error(source: str, name: str, problem: str) -> UserEncoderError:
    return UserEncoderError(f"{source}: field {name!r} {problem}")


def _three(source: str, name: str, value) -> tuple[float, float, float]:
    try:
        numbers = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        raise _field_error(source, name, f"must be 3 numbers, got {value!r}") from None
    if len(numbers) != 3 or not all(np.isfinite(numbers)):
        raise _field_error(source, name, f"must be 3 finite numbers, got {value!r}")
    if name == "std" and min(numbers) <= 0:
        raise _field_error(source, name, f"must be positive, got {value!r}")
    return numbers


def _choice(source: str, name: str, value, allowed) -> str:
    if value not in allowed:
        raise _field_error(source, name, f"must be one of {', '.join(allowed)}, got {value!r}")
    return value


def _positive_int(source: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise _field_error(source, name, f"must be a positive integer, got {value!r}")
    return int(value)


def newcomer_id(name: str, source: str) -> str:
    """``user.<name>``, the name made of lower-case letters, digits and ``_`` (anything else becomes ``_``).

    >>> newcomer_id("My-ViT.v2", "mine.yaml")
    'user.my_vit_v2'
    """
    cleaned = re.sub(r"[^a-z0-9_]+", "_", str(name).lower()).strip("_")
    if not cleaned:
        raise _field_error(source, "name", f"must hold a letter or a digit, got {name!r}")
    return f"{NEWCOMER_NAMESPACE}.{cleaned}"


def preprocessing_fields(source: str, values: dict) -> dict:
    """The validated preprocessing fields of ``values`` (a spec file's, or an entry point's dict)."""
    return {"input_size": _positive_int(source, "input_size", values["input_size"]),
            "mean": _three(source, "mean", values["mean"]), "std": _three(source, "std", values["std"]),
            "interpolation": _choice(source, "interpolation", values["interpolation"], INTERPOLATIONS),
            "resize_mode": _choice(source, "resize_mode", values.get("resize_mode", "crop"), RESIZE_MODES)}


# --------------------------------------------------------------------------- builders

def _torchscript_builder(spec: EncoderSpec, *, weights=None, device="cpu") -> UserEncoder:
    path = Path(weights)
    try:
        with warnings.catch_warnings():  # torch deprecates TorchScript, our format: not the user's to act on
            warnings.filterwarnings("ignore", message="`torch.jit.load` is deprecated", category=FutureWarning)
            model = torch.jit.load(str(path), map_location="cpu")
    except (RuntimeError, ValueError) as exc:
        raise WrongWeightsError(f"{spec.id}: {path} is not a TorchScript file saved with torch.jit.save "
                                f"({str(exc).splitlines()[0]})") from exc
    return UserEncoder(spec, model, device=device, weights_path=path)


def _timm_builder(spec: EncoderSpec, *, weights=None, device="cpu") -> Encoder:
    from crsrepro.encoders.timm_family import build_timm, timm_from_state_dict
    from crsrepro.encoders.weights import load_state_dict

    path = Path(weights)
    if path.is_dir() or (path.parent / "config.json").is_file():
        return build_timm(spec, weights=path, device=device)
    return timm_from_state_dict(spec, load_state_dict(path), model_args={}, device=device, weights_path=path,
                                weights_files=[path])


def _demo_builder(architecture: str, with_weights: bool, source: str) -> Callable:
    """The demo panel's builder of ``architecture``: the one that reads a weights file when one is given."""
    from crsrepro.encoders.demo import DEMO_ENCODERS

    known = sorted({s.architecture for s, _ in DEMO_ENCODERS})
    for spec, builder in DEMO_ENCODERS:
        if spec.architecture == architecture and bool(spec.weight_files) == with_weights:
            return builder
    if architecture in known:
        raise _field_error(source, "weights", f"{'is not taken' if with_weights else 'is needed'} by the demo "
                                              f"architecture {architecture!r}")
    raise _field_error(source, "architecture", f"must be a demo architecture ({', '.join(known)}) with builder "
                                               f"demo, got {architecture!r}")


def _builder(kind: str, architecture: str, source: str, with_weights: bool) -> Callable:
    if kind == "timm":
        return _timm_builder
    if kind == "open_clip":
        from crsrepro.encoders.open_clip_family import build_open_clip
        return build_open_clip
    if kind == "transformers":
        from crsrepro.encoders.transformers_family import ARCHITECTURES, build_transformers
        if architecture not in ARCHITECTURES:
            raise _field_error(source, "architecture", f"must be one of {', '.join(ARCHITECTURES)} with builder "
                                                       f"transformers, got {architecture!r}")
        return build_transformers
    if kind == "torchscript":
        return _torchscript_builder
    return _demo_builder(architecture, with_weights, source)


# --------------------------------------------------------------------------- the two ways in

def load_spec_file(path: str | Path, *, panel: tuple[str, ...] = (), device: str = "cpu") -> Newcomer:
    """Read, validate, build, check and register the encoder a spec file describes (the module docstring
    lists the fields); ``panel`` is the profile's panel, searched for a twin (:func:`panel_twin`).

    Raises
    ------
    UserEncoderError
        The file is missing or not YAML, a field is unknown, missing or bad (the message names it), the
        weights are not there, or the network's output is not a finite ``[B, D]``.
    """
    path = Path(path)
    source = str(path)
    if not path.is_file():
        raise UserEncoderError(f"spec file {path} does not exist")
    try:
        values = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        values = f"not valid YAML ({str(exc).splitlines()[0]})"
    if not isinstance(values, dict):
        problem = values if isinstance(values, str) else f"a {type(values).__name__}"
        raise UserEncoderError(f"{source}: expected a YAML mapping of fields ({', '.join(REQUIRED_FIELDS)}, ...), "
                               f"got {problem}")
    values = dict(values)
    if "loader" in values and "builder" not in values:  # a registry spec's name for the same field
        values["builder"] = values.pop("loader")
    unknown = sorted(set(values) - set(REQUIRED_FIELDS) - set(OPTIONAL_FIELDS))
    if unknown:
        raise _field_error(source, unknown[0], f"is not a spec field (fields: {', '.join(REQUIRED_FIELDS + OPTIONAL_FIELDS)})")
    missing = [k for k in REQUIRED_FIELDS if values.get(k) is None]
    if missing:
        raise _field_error(source, missing[0], "is missing")
    kind = _choice(source, "builder", values["builder"], BUILDERS)
    family = _choice(source, "family", values.get("family", "general"), FAMILIES)
    pooling = _choice(source, "pooling", values["pooling"], POOLINGS)
    if kind == "torchscript" and pooling != "image_embed":
        raise _field_error(source, "pooling", f"must be image_embed with builder torchscript (the module's output "
                                              f"is the embedding), got {pooling!r}")
    fields = preprocessing_fields(source, values)
    weights = values.get("weights")
    if weights is None and kind != "demo":
        raise _field_error(source, "weights", f"is missing (builder {kind} reads a weights file or folder)")
    if weights is not None:
        weights = Path(str(weights)).expanduser()
        weights = weights if weights.is_absolute() else path.parent / weights
        if not weights.exists():
            raise _field_error(source, "weights", f"names {weights}, which does not exist")
    architecture = str(values["architecture"])
    builder = _builder(kind, architecture, source, weights is not None)
    declared_dim = values.get("embed_dim")
    if declared_dim is not None:
        _positive_int(source, "embed_dim", declared_dim)
    try:
        spec = EncoderSpec(id=newcomer_id(values.get("name") or path.stem, source), family=family, loader=kind,
                           architecture=architecture, pooling=pooling, embed_dim=int(declared_dim or 1),
                           layer_taps=(FINAL,), licence=str(values["licence"]),
                           pad_fill=tuple(values.get("pad_fill", (0, 0, 0))),
                           notes=str(values.get("notes", f"a newcomer from the spec file {path.name}")), **fields)
    except (TypeError, ValueError) as exc:  # the fields the spec validates itself (pad_fill)
        raise UserEncoderError(f"{source}: {exc}") from None
    return _register(spec, builder, source=source, weights=None if weights is None else str(weights),
                     declared_dim=declared_dim, panel=panel, device=device)


def load_entry_point(entry: str, *, device: str = "cpu") -> Newcomer:
    """Import ``package.module:build`` (or ``path/to/file.py:build``), call ``build()`` and register what it
    returns (a module, or ``(module, preprocessing)``; see the module docstring).

    Raises
    ------
    UserEncoderError
        The entry point cannot be imported or called, it returns no module, its preprocessing is bad (the
        field is named), or the module's output is not a finite ``[B, D]``.
    """
    module_name, _, attr = entry.partition(":")
    if not module_name or not attr:
        raise UserEncoderError(f"entry point {entry!r}: expected package.module:function (or file.py:function)")
    try:
        if module_name.endswith(".py"):
            file = Path(module_name).expanduser().absolute()
            if not file.is_file():
                raise UserEncoderError(f"entry point {entry!r}: {file} does not exist")
            loader_spec = importlib.util.spec_from_file_location(f"crsrepro_user_{file.stem}", file)
            module = importlib.util.module_from_spec(loader_spec)
            loader_spec.loader.exec_module(module)
        else:
            if "" not in sys.path and str(Path.cwd()) not in sys.path:  # as `python -m` does: the working folder
                sys.path.insert(0, str(Path.cwd()))
            module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UserEncoderError(f"entry point {entry!r}: cannot import {module_name} ({exc})") from None
    build = getattr(module, attr, None)
    if not callable(build):
        raise UserEncoderError(f"entry point {entry!r}: {module_name} has no function {attr!r}")
    made = build()
    model, given = made if isinstance(made, tuple) and len(made) == 2 else (made, None)
    if not isinstance(model, torch.nn.Module):
        raise UserEncoderError(f"entry point {entry!r} returned a {type(model).__name__}, expected a torch.nn.Module "
                               f"(or a pair: module, preprocessing)")
    if isinstance(given, Preprocessing):
        given = dataclasses.asdict(given)
    if given is not None and not isinstance(given, dict):
        raise UserEncoderError(f"entry point {entry!r}: the preprocessing is a {type(given).__name__}, expected a "
                               f"crsrepro.encoders.user.Preprocessing or a dict of its fields")
    given = dict(given or {})
    known = [f.name for f in dataclasses.fields(Preprocessing)]
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise _field_error(entry, unknown[0], f"is not a preprocessing field ({', '.join(known)})")
    defaults_used = tuple(k for k in known if k not in given)
    fields = preprocessing_fields(entry, {**dataclasses.asdict(DEFAULT_PREPROCESSING), **given})
    source_file = Path(module.__file__) if getattr(module, "__file__", None) else None
    spec = EncoderSpec(id=newcomer_id(f"{module_name.removesuffix('.py').split('/')[-1]}_{attr}", entry),
                       family="general", loader="python", architecture=entry, pooling="image_embed", embed_dim=1,
                       layer_taps=(FINAL,), licence="unstated (a Python entry point)",
                       notes=f"a newcomer from the entry point {entry}", **fields)

    def builder(spec, *, weights=None, device="cpu"):
        if weights is not None:
            raise WrongWeightsError(f"{spec.id}: an entry point builds its own weights; got weights={weights}")
        return UserEncoder(spec, model, device=device, source_file=source_file)

    return _register(spec, builder, source=entry, weights=None, declared_dim=None, panel=(), device=device,
                     defaults_used=defaults_used)


def _register(spec: EncoderSpec, builder: Callable, *, source: str, weights: str | None, declared_dim,
              panel: tuple, device: str, defaults_used: tuple = ()) -> Newcomer:
    """Build once to check the output and learn D, then register the spec with its real ``embed_dim``."""
    try:
        built = builder(spec, weights=weights, device=device)
    except (MissingWeightsError, WrongWeightsError) as exc:
        raise UserEncoderError(f"{source}: field 'weights': {exc}") from None
    dim = check_output(built)
    if declared_dim is not None and int(declared_dim) != dim:
        raise _field_error(source, "embed_dim", f"says {declared_dim}, but the network returns {dim}-d embeddings")
    spec = dataclasses.replace(spec, embed_dim=dim)
    built.spec = spec
    digest = built.weights_hash
    twin = panel_twin(spec, digest, panel)
    if twin is not None:
        return Newcomer(spec=get_encoder_spec(twin), source=source, weights=None, weights_hash=digest,
                        defaults_used=defaults_used, twin_of=twin)
    def bound(spec, *, weights=None, device="cpu"):  # create_encoder(id) reads the spec file's weights
        return builder(spec, weights=weights if weights is not None else given, device=device)

    given = weights
    register_newcomer(spec, bound)
    return Newcomer(spec=spec, source=source, weights=weights, weights_hash=digest, defaults_used=defaults_used)


def panel_twin(spec: EncoderSpec, digest: str, panel: tuple[str, ...]) -> str | None:
    """The panel member that ``spec`` with weights hashing to ``digest`` is, or None: same builder,
    architecture, preprocessing, pooling at ``final`` and feature layer, and the same weights hash
    (a member whose weights are not on this machine is no twin)."""
    for member in panel:
        if member not in list_encoders():
            continue
        other = get_encoder_spec(member)
        if (other.loader, other.architecture, other.preprocessing, other.pooling, other.feature_layer) != \
                (spec.loader, spec.architecture, spec.preprocessing, spec.pooling, spec.feature_layer):
            continue
        try:
            if create_encoder(member).weights_hash == digest:
                return member
        except (MissingWeightsError, WrongWeightsError):
            continue
    return None


__all__ = ["BUILDERS", "DEFAULT_PREPROCESSING", "Newcomer", "Preprocessing", "UserEncoder", "UserEncoderError",
           "check_output", "checked_embedding", "load_entry_point", "load_spec_file", "newcomer_id",
           "panel_twin", "preprocessing_fields"]
