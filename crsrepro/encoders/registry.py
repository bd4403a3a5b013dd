"""The encoder registry: frozen specs, one factory, and the :class:`Encoder` contract (DESIGN.md section 4).

The contract
------------
Every encoder, paper or demo, is described by a frozen :class:`EncoderSpec` and built by
:func:`create_encoder`, the only way in. The spec carries everything that changes the features:
the preprocessing (input size, interpolation, mean/std), the pooling (which tensor is the embedding)
and the layer taps. The analyses read ``spec.family``, never the id.

An :class:`Encoder` (subclassed once per loader family, and by the demo panel) offers

- ``preprocess(batch_uint8)``: ``uint8 [B, 3, H, W] -> float [B, 3, S, S]`` on ``encoder.device``:
  :meth:`Encoder.resize` (:func:`resize_to_input`: ``spec.resize_mode`` ``crop``, the short side to
  ``S = spec.input_size`` then a centre crop, or ``pad``, padded to a square with ``spec.pad_fill`` then
  resized to ``S``; ``spec.interpolation``, antialiased) and the spec's mean/std normalisation. This is
  the batched tensor path that :mod:`crsrepro.extract.features` uses; it may call :meth:`Encoder.resize` early
  (in a data-loader worker), after which ``preprocess`` only normalises.
- ``forward_features(x, *, layers=("final",))``: ``{layer: float [B, D]}`` for layer names among
  ``spec.layer_taps``, all from ONE forward pass, each pooled as the spec says. Subclasses implement
  :meth:`Encoder._forward_layers`; the base class validates the names and runs it without gradients.
- ``encode_images(images)``: a list of PIL images to an ``(N, D)`` float32 array at ``"final"``; the
  two methods above, in batches.
- ``weights_hash``: a SHA-256 of what the weights are, part of every feature-cache key: the files the
  builder actually read (``weights_files``: the weight file and the config that shaped the network),
  never the other files of a snapshot folder (a README edit or a language-model shard does not change
  it); for MedGemma the tower tensors themselves (``hash_parameters``), since its shards are mostly
  language model; for a model built without a file, its parameters and buffers.

Layer taps are named ``"depth25"``, ``"depth50"``, ``"depth75"`` and ``"final"`` for networks (the blocks
at 25/50/75/100 % of the depth, :func:`depth_block_indices`; DESIGN.md section 11) and ``("final",)``
for extractors that are not networks. The paper's networks also offer ``"depth100"``
(:data:`PAPER_TAPS`): the last block's tokens pooled like the other depth taps
(``spec.intermediate_pooling``). Where ``final`` is a head or a projection (CLIP, BiomedCLIP, CheXzero,
SigLIP, MedSigLIP) ``depth100`` differs from it, so a depth curve ``depth25 .. depth100`` compares like
with like; elsewhere ``depth100`` equals ``final``.

Where the weights are found, how they are read and what they hash to is :mod:`crsrepro.encoders.weights`
(nothing is ever downloaded).

The registry is filled in one place, :mod:`crsrepro.encoders`, never as a side effect of an import
(STYLE.md).
"""

from __future__ import annotations

import difflib
import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from crsrepro.core.errors import UnknownEncoderError
from crsrepro.core.schema import FINAL
from crsrepro.encoders.weights import state_dict_hash, weights_hash

logger = logging.getLogger(__name__)

FAMILIES = ("general", "medical", "specialist")
LOADERS = ("timm", "open_clip", "transformers", "local", "demo", "torchscript", "python")
"""``torchscript`` (a saved TorchScript module) and ``python`` (a Python entry point) are newcomers' only
(:mod:`crsrepro.encoders.user`)."""
INTERPOLATIONS = ("bicubic", "bilinear")
POOLINGS = ("cls", "mean_patch", "image_embed", "gap")
RESIZE_MODES = ("crop", "pad")
INTENSITY_REMAPS = ("none", "minmax")
NETWORK_TAPS = ("depth25", "depth50", "depth75", FINAL)
PAPER_TAPS = ("depth25", "depth50", "depth75", "depth100", FINAL)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
HALF = (0.5, 0.5, 0.5)
_TAP_DEPTH = {"depth25": 0.25, "depth50": 0.50, "depth75": 0.75, "depth100": 1.0, FINAL: 1.0}


@dataclass(frozen=True)
class EncoderSpec:
    """What an encoder is and how its inputs are prepared; frozen, so it can travel with the weights.

    Parameters
    ----------
    id : str
        ``namespace.name``, e.g. ``general.dinov2`` or ``demo.effnet_lite0``.
    family : str
        ``general``, ``medical`` or ``specialist`` for the paper's encoders; the demo panel may use its
        own family names. The analyses group by this field (DESIGN.md section 4).
    loader : str
        ``timm``, ``open_clip``, ``transformers``, ``local`` (a released state-dict file) or ``demo``;
        for a newcomer also ``torchscript`` or ``python`` (:mod:`crsrepro.encoders.user`).
    architecture : str
        The architecture name within the loader (a timm model name, an open_clip model name, a
        transformers class name, or a local format name).
    input_size : int
        Side of the square image the network sees.
    mean, std : tuple of 3 floats
        Per-channel normalisation applied to images scaled to [0, 1].
    interpolation : str
        ``bicubic`` or ``bilinear``, used (with antialiasing) to resize to ``input_size``.
    resize_mode : str
        ``crop`` (default): the short side to ``input_size``, then a centre crop; ``pad``: the image is
        first padded to a centred square with ``pad_fill``, then resized to ``input_size`` (MedSigLIP,
        LLaVA and CheXzero do this).
    pad_fill : tuple of 3 ints
        The ``uint8`` colour of the padding in ``pad`` mode (zeros: black).
    pad_fill_grey : int or None
        The grey level that pads a greyscale image (one whose three channels are equal, as greyscale
        files are read) instead of ``pad_fill``; None: ``pad_fill`` for every image. LLaVA pads an ``L``
        image with one grey, ``int(255 * mean(image_mean))`` (114 for OpenAI CLIP), and an RGB image with
        the mean colour.
    intensity_remap : str
        ``none`` (default), or ``minmax``: each image's intensities are stretched to 0..255 before the
        resize (hi-ml's ``remap_to_uint8``, BioViL's ``load_image``: subtract the minimum, divide by the
        maximum, times 255, truncated to uint8).
    pooling : str
        The embedding: ``cls`` (class token), ``mean_patch`` (mean of the patch tokens),
        ``image_embed`` (the model's projected image embedding) or ``gap`` (global average pooling of
        a convolutional feature map).
    embed_dim : int
        Dimension of the ``final`` embedding of the real checkpoint.
    layer_taps : tuple of str
        The layer names ``forward_features`` accepts; :data:`NETWORK_TAPS` for networks,
        :data:`PAPER_TAPS` (with ``depth100``) for the paper's.
    licence : str
        The licence of the weights, as released.
    excluded_datasets : tuple of str
        Datasets the paper does not evaluate this encoder on (BioViL and CheXzero on APTOS).
    hf_repo : str or None
        The Hugging Face repository whose offline cache holds the weights, if any.
    hf_revision : str or None
        The revision (tag, branch or commit) of ``hf_repo`` to read from the cache; ``None`` means the
        cache's ``main``. Part of :attr:`preprocessing` (and so of the feature-cache key) when set.
    weight_files : tuple of str
        File names expected in the weights folder (any one of them suffices); named in errors.
    weight_md5 : str or None
        The MD5 of the weight file where the release documents one (BioViL); a file that differs is
        refused.
    n_params : int or None
        The parameter count of the network as we build it from the real checkpoint (the image tower,
        without a classifier head); ``crsrepro check-weights`` compares a local file against it.
    intermediate_pooling : str or None
        Pooling of the intermediate taps when ``pooling`` is ``image_embed`` (which exists only at the
        end of the network); ``None`` means the same as ``pooling``.
    feature_layer : int
        Index of the block whose output is ``final`` (``-1``: the last; LLaVA uses ``-2``).
    notes : str
        Where the paper is silent, what we chose and why (the [ours] choices).
    """

    id: str
    family: str
    loader: str
    architecture: str
    input_size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    interpolation: str
    pooling: str
    embed_dim: int
    layer_taps: tuple[str, ...]
    licence: str
    excluded_datasets: tuple[str, ...] = ()
    hf_repo: str | None = None
    hf_revision: str | None = None
    weight_files: tuple[str, ...] = ()
    weight_md5: str | None = None
    n_params: int | None = None
    resize_mode: str = "crop"
    pad_fill: tuple[int, int, int] = (0, 0, 0)
    pad_fill_grey: int | None = None
    intensity_remap: str = "none"
    intermediate_pooling: str | None = None
    feature_layer: int = -1
    notes: str = ""

    def __post_init__(self):
        problems = []
        if "." not in self.id:
            problems.append("id must be namespace.name")
        if self.loader not in LOADERS:
            problems.append(f"loader must be one of {LOADERS}")
        if self.loader != "demo" and self.family not in FAMILIES:
            problems.append(f"family must be one of {FAMILIES}")
        if self.interpolation not in INTERPOLATIONS:
            problems.append(f"interpolation must be one of {INTERPOLATIONS}")
        if self.resize_mode not in RESIZE_MODES:
            problems.append(f"resize_mode must be one of {RESIZE_MODES}")
        if len(self.pad_fill) != 3 or not all(0 <= int(v) <= 255 for v in self.pad_fill):
            problems.append("pad_fill must be 3 integers in 0..255")
        if self.pad_fill_grey is not None and not 0 <= int(self.pad_fill_grey) <= 255:
            problems.append("pad_fill_grey must be an integer in 0..255")
        if self.intensity_remap not in INTENSITY_REMAPS:
            problems.append(f"intensity_remap must be one of {INTENSITY_REMAPS}")
        if self.pooling not in POOLINGS or (self.intermediate_pooling or "cls") not in POOLINGS:
            problems.append(f"pooling must be one of {POOLINGS}")
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            problems.append("mean and std must be 3 numbers, std > 0")
        if not self.layer_taps or FINAL not in self.layer_taps or not set(self.layer_taps) <= set(_TAP_DEPTH):
            problems.append(f"layer_taps must include 'final' and be among {tuple(_TAP_DEPTH)}")
        if self.input_size <= 0 or self.embed_dim <= 0:
            problems.append("input_size and embed_dim must be positive")
        if problems:
            raise ValueError(f"EncoderSpec {self.id!r}: " + "; ".join(problems))

    @property
    def preprocessing(self) -> dict:
        """The fields that decide the network input, and the pinned revision (part of the feature-cache key).

        ``pad_fill`` and ``hf_revision`` appear only when they apply, so the keys of crop-mode,
        unpinned encoders are those of earlier versions.
        """
        fields = {"input_size": self.input_size, "mean": list(self.mean), "std": list(self.std),
                  "interpolation": self.interpolation}
        if self.resize_mode == "crop":
            fields["resize"] = "short_side_then_center_crop"
        else:
            fields.update(resize="pad_to_square_then_resize", pad_fill=[int(v) for v in self.pad_fill])
            if self.pad_fill_grey is not None:
                fields["pad_fill_grey"] = int(self.pad_fill_grey)
        if self.intensity_remap != "none":
            fields["intensity_remap"] = self.intensity_remap
        if self.hf_revision is not None:
            fields["hf_revision"] = self.hf_revision
        return fields

    def pooling_at(self, layer: str) -> str:
        """The pooling used at ``layer``: ``pooling`` at ``final``, else ``intermediate_pooling``."""
        if layer == FINAL or self.intermediate_pooling is None:
            return self.pooling
        return self.intermediate_pooling


def depth_block_indices(n_blocks: int, layers: Sequence[str]) -> dict[str, int]:
    """Map tap names to 0-based block indices: the block at 25/50/75/100 % of ``n_blocks``.

    >>> depth_block_indices(12, ["depth25", "depth50", "depth75", "final"])
    {'depth25': 2, 'depth50': 5, 'depth75': 8, 'final': 11}
    >>> depth_block_indices(4, ["depth25", "depth100", "final"])
    {'depth25': 0, 'depth100': 3, 'final': 3}
    """
    if n_blocks < 1:
        raise ValueError(f"n_blocks must be positive, got {n_blocks}")
    unknown = [name for name in layers if name not in _TAP_DEPTH]
    if unknown:
        raise ValueError(f"unknown layer taps {unknown}; expected among {tuple(_TAP_DEPTH)}")
    return {name: max(1, round(_TAP_DEPTH[name] * n_blocks)) - 1 for name in layers}


def pool_tokens(tokens: torch.Tensor, pooling: str, *, num_prefix_tokens: int) -> torch.Tensor:
    """Pool transformer tokens ``[B, N, D]`` to ``[B, D]``.

    ``cls`` takes token 0; ``mean_patch`` averages the tokens after the ``num_prefix_tokens`` prefix
    (class and register tokens).

    >>> t = torch.arange(12.).reshape(1, 3, 4)
    >>> pool_tokens(t, "cls", num_prefix_tokens=1).tolist()
    [[0.0, 1.0, 2.0, 3.0]]
    >>> pool_tokens(t, "mean_patch", num_prefix_tokens=1).tolist()
    [[6.0, 7.0, 8.0, 9.0]]
    """
    if tokens.ndim != 3:
        raise ValueError(f"expected tokens [B, N, D], got shape {tuple(tokens.shape)}")
    if pooling == "cls":
        if num_prefix_tokens < 1:
            raise ValueError("cls pooling needs a class token (num_prefix_tokens >= 1)")
        return tokens[:, 0]
    if pooling == "mean_patch":
        return tokens[:, num_prefix_tokens:].mean(dim=1)
    raise ValueError(f"pooling {pooling!r} does not apply to tokens; expected 'cls' or 'mean_patch'")


def pool_feature_map(fmap: torch.Tensor) -> torch.Tensor:
    """Global average pooling of a convolutional map ``[B, C, H, W]`` to ``[B, C]``."""
    if fmap.ndim != 4:
        raise ValueError(f"expected a feature map [B, C, H, W], got shape {tuple(fmap.shape)}")
    return fmap.mean(dim=(2, 3))


# --------------------------------------------------------------------------------------------------
# The Encoder base class
# --------------------------------------------------------------------------------------------------

class Encoder:
    """An encoder built from a spec: the batched tensor path plus a convenience PIL path.

    Subclasses implement :meth:`_forward_layers`. See the module docstring for the contract.

    Parameters
    ----------
    spec : EncoderSpec
    model : torch.nn.Module or None
        The network (put in eval mode on ``device``), or None for extractors that are not networks.
    device : str or torch.device
    weights_path : Path or None
        The file or folder the weights came from.
    weights_files : sequence of Path or None
        The files the builder read (weights and the config that shaped the network); hashed for
        :attr:`weights_hash`. ``None``: ``weights_path`` is hashed (a whole folder, if a folder).
    hash_parameters : bool
        Add the loaded parameters and buffers to the hash (for weights read tensor by tensor out of
        files too large to hash whole: MedGemma).
    """

    def __init__(self, spec: EncoderSpec, model: torch.nn.Module | None, *, device="cpu",
                 weights_path: Path | None = None, weights_files=None, hash_parameters: bool = False):
        self.spec = spec
        self.device = torch.device(device)
        self.model = model.to(self.device).eval() if model is not None else None
        self.weights_path = Path(weights_path) if weights_path is not None else None
        self.weights_files = tuple(Path(p) for p in weights_files) if weights_files is not None else None
        self.hash_parameters = hash_parameters
        self._weights_hash = None
        mean = torch.tensor(spec.mean, dtype=torch.float32).view(1, 3, 1, 1)
        self._mean = mean.to(self.device)
        self._std = torch.tensor(spec.std, dtype=torch.float32).view(1, 3, 1, 1).to(self.device)

    def __repr__(self):
        return f"{type(self).__name__}({self.spec.id!r}, device={str(self.device)!r})"

    @property
    def weights_hash(self) -> str:
        """SHA-256 of the files read (plus the loaded tensors with ``hash_parameters``), else of the
        weights path, else of the model's parameters; subclasses without any of them override."""
        if self._weights_hash is None:
            if self.weights_files:
                parts = [weights_hash(self.weights_files)]
            else:
                parts = [weights_hash(self.weights_path)] if self.weights_path is not None else []
            if self.hash_parameters or not parts:
                if self.model is None:
                    raise NotImplementedError(f"{type(self).__name__} must define weights_hash")
                parts.append(state_dict_hash(self.model))
            self._weights_hash = parts[0] if len(parts) == 1 else hashlib.sha256("\n".join(parts).encode()).hexdigest()
        return self._weights_hash

    def resize(self, batch_uint8: torch.Tensor) -> torch.Tensor:
        """:func:`resize_to_input` with this encoder's spec."""
        return resize_to_input(self.spec, batch_uint8)

    def preprocess(self, batch_uint8: torch.Tensor) -> torch.Tensor:
        """``uint8 [B, 3, H, W]`` to the normalised float network input ``[B, 3, S, S]`` on the device."""
        if batch_uint8.ndim != 4 or batch_uint8.shape[1] != 3:
            raise ValueError(f"{self.spec.id}: expected images [B, 3, H, W], got {tuple(batch_uint8.shape)}")
        x = self.resize(batch_uint8.to(self.device, non_blocking=True))
        x = x.float() / 255.0 if x.dtype == torch.uint8 else x.float()
        return (x - self._mean) / self._std

    def forward_features(self, x: torch.Tensor, *, layers: Sequence[str] = (FINAL,)) -> dict[str, torch.Tensor]:
        """Pooled features ``{layer: [B, D]}`` for the requested taps, all from one forward pass."""
        layers = tuple(layers)
        unknown = [name for name in layers if name not in self.spec.layer_taps]
        if unknown or not layers:
            raise ValueError(f"{self.spec.id}: layers {list(layers)} must be a non-empty subset of "
                             f"{list(self.spec.layer_taps)}")
        with torch.inference_mode():
            out = self._forward_layers(x, layers)
        return {name: out[name].float() for name in layers}

    def _forward_layers(self, x: torch.Tensor, layers: tuple[str, ...]) -> Mapping[str, torch.Tensor]:
        """Subclasses: ``{layer: [B, D]}`` for every name in ``layers`` (already validated)."""
        raise NotImplementedError

    def encode_images(self, images: Sequence, *, batch_size: int = 32) -> np.ndarray:
        """Embed PIL images at ``final``: an ``(N, D)`` float32 array in the order given."""
        if len(images) == 0:
            raise ValueError(f"{self.spec.id}: encode_images needs at least one image")
        chunks = []
        for start in range(0, len(images), batch_size):
            batch = torch.stack([self.resize(pil_to_uint8_tensor(im)[None])[0]
                                 for im in images[start:start + batch_size]])
            feats = self.forward_features(self.preprocess(batch), layers=(FINAL,))[FINAL]
            chunks.append(feats.cpu().numpy().astype(np.float32))
        return np.concatenate(chunks)


def resize_to_input(spec: EncoderSpec, batch: torch.Tensor) -> torch.Tensor:
    """Bring ``[B, 3, H, W]`` images to ``spec.input_size`` squares, as ``spec.resize_mode`` says.

    ``crop``: resize the short side to ``input_size`` (antialiased) and centre-crop. ``pad``: pad to a
    centred square with ``spec.pad_fill`` (the extra row or column, if odd, goes to the bottom or right,
    as the releases do), then resize. Works on ``uint8`` or float tensors and keeps the dtype; a batch
    already at the input size is returned unchanged. A function of the spec alone, so data-loader
    workers can call it without the model. [ours] in ``crop`` mode the crop fraction is 1.0 for every
    encoder (most releases resize to a larger side and keep 0.875-0.94 of it), so every cropping
    encoder sees the same field of view; ``pad`` follows the releases that pad (MedSigLIP, LLaVA,
    CheXzero).
    """
    # imported here, not at the top: torchvision takes about a second to import, which a process that only
    # reads the registry's specs skips
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.v2 import functional as TF

    size = spec.input_size
    if spec.intensity_remap == "minmax":
        batch = remap_to_uint8(batch)
    if batch.shape[-2:] == (size, size):
        return batch
    mode = InterpolationMode.BICUBIC if spec.interpolation == "bicubic" else InterpolationMode.BILINEAR
    if spec.resize_mode == "pad":
        if spec.pad_fill_grey is None:
            batch = pad_to_square(batch, spec.pad_fill)
        else:  # per image: grey for a greyscale image, as LLaVA's expand2square
            grey = (spec.pad_fill_grey,) * 3
            batch = torch.cat([pad_to_square(image[None], grey if bool((image == image[:1]).all()) else spec.pad_fill)
                               for image in batch])
        return TF.resize(batch, [size, size], interpolation=mode, antialias=True)
    return TF.center_crop(TF.resize(batch, [size], interpolation=mode, antialias=True), [size, size])


def remap_to_uint8(batch: torch.Tensor) -> torch.Tensor:
    """Stretch each image of ``[B, 3, H, W]`` to the full range, as hi-ml's ``remap_to_uint8`` (BioViL):
    minus its minimum, divided by its maximum, times 255 (1.0 for float input), truncated for ``uint8``;
    a constant image stays as it is.

    >>> remap_to_uint8(torch.tensor([40, 120, 200], dtype=torch.uint8).view(1, 1, 1, 3).expand(1, 3, 1, 3))[0, 0].tolist()
    [[0, 127, 255]]
    """
    x = batch.double()
    low = x.amin(dim=(1, 2, 3), keepdim=True)
    span = x.amax(dim=(1, 2, 3), keepdim=True) - low
    scale = 255.0 if batch.dtype == torch.uint8 else 1.0
    out = torch.where(span > 0, (x - low) / span.clamp(min=1e-12) * scale, x)
    return out.to(torch.uint8) if batch.dtype == torch.uint8 else out.to(batch.dtype)


def pad_to_square(batch: torch.Tensor, fill: Sequence[int]) -> torch.Tensor:
    """Pad ``[B, 3, H, W]`` to a centred ``max(H, W)`` square of colour ``fill`` (0..255 per channel;
    divided by 255 for float input).

    >>> pad_to_square(torch.full((1, 3, 1, 3), 9, dtype=torch.uint8), (0, 0, 0))[0, 0].tolist()
    [[0, 0, 0], [9, 9, 9], [0, 0, 0]]
    """
    height, width = batch.shape[-2:]
    side = max(height, width)
    scale = 1 if batch.dtype == torch.uint8 else 255.0
    colour = torch.tensor([v / scale for v in fill], dtype=batch.dtype, device=batch.device)
    out = colour.view(1, 3, 1, 1).expand(batch.shape[0], 3, side, side).clone()
    top, left = (side - height) // 2, (side - width) // 2
    out[:, :, top:top + height, left:left + width] = batch
    return out


def pil_to_uint8_tensor(image) -> torch.Tensor:
    """A PIL image (any mode) as an RGB ``uint8 [3, H, W]`` tensor."""
    array = np.asarray(image.convert("RGB"), dtype=np.uint8)
    return torch.from_numpy(array.copy()).permute(2, 0, 1)


# --------------------------------------------------------------------------------------------------
# The registry
# --------------------------------------------------------------------------------------------------

Builder = Callable[..., Encoder]  # builder(spec, *, weights, device) -> Encoder
_REGISTRY: dict[str, tuple[EncoderSpec, Builder]] = {}


def register(spec: EncoderSpec, builder: Builder) -> None:
    """Add ``spec`` with its ``builder(spec, *, weights, device) -> Encoder``; a duplicate id raises."""
    if spec.id in _REGISTRY:
        raise ValueError(f"encoder {spec.id!r} is already registered")
    _REGISTRY[spec.id] = (spec, builder)


def list_encoders() -> list[str]:
    """The registered encoder ids, in registration order."""
    return list(_REGISTRY)


def _lookup(encoder_id: str) -> tuple[EncoderSpec, Builder]:
    try:
        return _REGISTRY[encoder_id]
    except KeyError:
        close = difflib.get_close_matches(str(encoder_id), list(_REGISTRY), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(_REGISTRY)}"
        raise UnknownEncoderError(f"unknown encoder {encoder_id!r}{hint}") from None


def get_encoder_spec(encoder_id: str) -> EncoderSpec:
    """The frozen spec of ``encoder_id``; an unknown id raises UnknownEncoderError with close matches."""
    return _lookup(encoder_id)[0]


def create_encoder(encoder_id: str, *, weights: str | os.PathLike | None = None, device="cpu") -> Encoder:
    """Build encoder ``encoder_id`` on ``device`` from local weights (``weights`` overrides the lookup).

    Raises
    ------
    UnknownEncoderError
        The id is not registered.
    MissingWeightsError
        The weights are not found (see :func:`crsrepro.encoders.weights.resolve_weights`).
    WrongWeightsError
        A weight file is found but is not the released one (it cannot be read, or does not fit).
    """
    spec, builder = _lookup(encoder_id)
    return builder(spec, weights=weights, device=device)


NEWCOMER_NAMESPACE = "user"
"""The id namespace of encoders registered at run time to be scored (``crsrepro score --spec`` or
``--encoder module:build``; :mod:`crsrepro.encoders.user`)."""


def register_newcomer(spec: EncoderSpec, builder: Builder) -> None:
    """Register a user's encoder (id ``user.<name>``) for scoring, replacing an earlier newcomer of the
    same id in this process (a test or a notebook that scores two versions of one encoder); a panel id
    is never replaced (DESIGN.md section 1, item 4: the panel stays as frozen)."""
    if spec.id.split(".")[0] != NEWCOMER_NAMESPACE:
        raise ValueError(f"a newcomer's id must be {NEWCOMER_NAMESPACE}.<name>, got {spec.id!r}")
    _REGISTRY.pop(spec.id, None)
    register(spec, builder)


def forget_newcomers() -> list[str]:
    """Remove every newcomer (``user.*``) from the registry; returns their ids. The panel is untouched, so
    code that loops over :func:`list_encoders` after a newcomer was scored sees the registry as filled."""
    ids = [i for i in _REGISTRY if i.split(".")[0] == NEWCOMER_NAMESPACE]
    for encoder_id in ids:
        del _REGISTRY[encoder_id]
    return ids
