"""LoRA fine-tuning as the ``regime="lora"`` axis of the run grid (DESIGN.md section 11).

:func:`finetune` adapts one encoder to one dataset for one seed and label fraction: peft LoRA adapters
(rank 8, alpha 16) on the modules :func:`lora_targets` names (:mod:`crsrepro.encoders.lora_targets`:
the attention projections of transformers, the MLP of CLIP-style blocks, the ``Conv2d`` layers of CNNs),
a linear head on the ``final`` embedding, AdamW at a constant learning rate, and one training rule for
every encoder and label fraction: a *fixed optimiser-step budget* [ours], the steps of ``epochs`` passes
over the seed's full-label train split (the paper's 8 epochs at 100 % labels), so that a fine-tune on 1 %
of the labels takes as many steps as one on all of them and retention after LoRA does not mix the
amount of data with the training budget (:meth:`LoraParams.budget`). Everything a fine-tune trains with
is one :class:`LoraParams`, and its fields derive the keys, so a changed default is never served a stale
row-set or checkpoint. The base network stays in eval mode (BatchNorm statistics and dropout frozen
[ours]), its weights never receive a gradient and are unchanged bit for bit; only the adapters and the
head train. :func:`step_check` proves it per encoder (every adapter gets a gradient, the base is unchanged).

It trains on the seed's train split at the label fraction (the grid's label subsets,
:class:`crsrepro.run.units.Unit`), clean images at their stored size, like the frozen probe's pool.
After every ``steps_per_epoch`` optimiser steps the adapters, the head and the optimiser state are saved
under ``<output_dir>/lora/checkpoints/<key>/step_<k>.pt`` (atomically); a killed run resumes from the
last one, and since the batch stream is a function of the seed alone (pass ``p`` visits the labelled
images in the order ``default_rng([seed, p])``) and the learning rate is constant, the resumed run ends
with the same weights as an uninterrupted one (on the same device). A longer budget continues from a
shorter one's checkpoints.

:func:`score` embeds the test split under every condition of the profile (and each transfer set:
MIMIC-CXR for CheXpert) with the *fine-tuned* network and scores the head through the grid unit's own
scoring (:meth:`crsrepro.run.units.Unit.score`: AUROC, ECE, classwise ECE, and at 100 % labels the four
recalibrators fitted on the seed's val split, temperature scaling among them), into tidy rows with
``regime="lora"``. :class:`LoraStage` runs cells x seeds x fractions (the profile's ``lora`` plan) into
``<output_dir>/lora/`` as a stage of :func:`crsrepro.run.stages.run_stages`; the comparison with the
frozen ranking is :mod:`crsrepro.analyse.lora` (chapter 07).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
import pandas as pd
import torch
from torch import nn

from crsrepro.core import __version__
from crsrepro.core.errors import CrsreproError
from crsrepro.core.io import atomic_write, content_key, git_hash
from crsrepro.core.schema import FINAL, LORA
from crsrepro.core.vocab import CLEAN, LINEAR
from crsrepro.profiles import Profile, as_profile
from crsrepro.run import units, views
from crsrepro.run.executor import Task
from crsrepro.run.results import CACHE_VERSION, ResultStore
from crsrepro.run.stages import holds_gpu
from crsrepro.run.units import Unit, case_arrays, feature_requests, labels_key, layer_feature_keys

log = logging.getLogger(__name__)

STAGE = "lora"


class LoraError(CrsreproError, ValueError):
    """An encoder without declared LoRA targets, or a fraction or seed the profile does not have."""


def lora_targets(encoder) -> list[str]:
    """The peft ``target_modules`` of a built encoder: the full names of the modules its pattern in
    :data:`crsrepro.encoders.lora_targets.TARGETS` matches (:func:`crsrepro.encoders.lora_targets.target_modules`).

    Raises
    ------
    LoraError
        No pattern is declared for the encoder (the demo's classical extractors have no layers to adapt),
        or it matches no module of this build (another library version renamed the modules).
    """
    from crsrepro.encoders.lora_targets import CHECKED_ON, TARGETS, target_modules

    spec = encoder.spec
    if spec.id not in TARGETS:
        raise LoraError(f"{spec.id}: no LoRA target modules are declared (crsrepro.encoders.lora_targets.TARGETS "
                        f"covers {len(TARGETS)} encoders)")
    names = target_modules(encoder)
    if not names:
        raise LoraError(f"{spec.id}: its LoRA pattern {TARGETS[spec.id]!r} matches no module of "
                        f"{type(encoder.model).__name__} (checked on {CHECKED_ON})")
    return names


def adaptable(encoders) -> list[str]:
    """The encoders among ``encoders`` that LoRA can adapt (a pattern is declared for them)."""
    from crsrepro.encoders.lora_targets import TARGETS

    return [e for e in encoders if e in TARGETS]


@dataclass(frozen=True)
class LoraParams:
    """What one fine-tune trains with (DESIGN.md section 11). :func:`finetune` receives it, and its fields
    derive the checkpoint key (:meth:`training`) and the row-set key (:func:`rowset_key`).

    Attributes
    ----------
    epochs : int
        The budget, the same for every encoder and label fraction: the optimiser steps of ``epochs``
        passes over the seed's *full-label* train split (:meth:`budget`; the paper: 8 epochs; a profile's
        ``lora.epochs``). [ours] a fixed step budget, so that a small label fraction is not also a small
        training budget (at 1 % of APTOS, 8 epochs of its labelled images would be 8 steps).
    rank, alpha : int
        LoRA rank and scaling (the paper: 8 and 16).
    dropout : float
        [ours] Dropout on the adapters: none, the paper names none.
    lr, weight_decay : float
        [ours] AdamW at a constant learning rate (no schedule: a resumed run equals an uninterrupted one);
        the weight decay is AdamW's default.
    batch_size : int
        [ours] 32 on the CPU; the GPU protocol uses 128 (``benchmarks/lora.py``).
    accumulation_steps : int
        Batches whose gradients are summed before a step (the GPU path's large effective batch).
    target_modules : tuple of str, optional
        The adapted modules' full names; None: the encoder's declared targets (:func:`lora_targets`).
    """

    epochs: int = 8
    rank: int = 8
    alpha: int = 16
    dropout: float = 0.0
    lr: float = 1e-3
    weight_decay: float = 1e-2
    batch_size: int = 32
    accumulation_steps: int = 1
    target_modules: tuple | None = None

    def resolved(self, encoder) -> "LoraParams":
        """These parameters with ``target_modules`` filled in for the built ``encoder``."""
        if self.target_modules is not None:
            return self
        return dataclasses.replace(self, target_modules=tuple(lora_targets(encoder)))

    def steps_per_epoch(self, n_train: int) -> int:
        """Optimiser steps in one pass over ``n_train`` images (batches of ``batch_size``, a step every
        ``accumulation_steps`` batches)."""
        return math.ceil(math.ceil(n_train / self.batch_size) / self.accumulation_steps)

    def budget(self, n_train: int) -> int:
        """The optimiser steps of every fine-tune whose full-label train split has ``n_train`` images,
        whatever its label fraction: ``epochs`` passes over the full split.

        >>> LoraParams(epochs=8, batch_size=32).budget(100)
        32
        """
        return self.epochs * self.steps_per_epoch(n_train)

    def training(self) -> dict:
        """What decides the weights after each step (every field but the budget, ``epochs``, so that a
        longer budget continues from a shorter one's checkpoints), with the optimiser, schedule and
        budget rule that :func:`train` implements."""
        if self.target_modules is None:
            raise LoraError("LoRA parameters without target modules: resolve them for an encoder first")
        fields = {k: v for k, v in dataclasses.asdict(self).items() if k != "epochs"}
        return {**fields, "target_modules": list(self.target_modules), "optimiser": "AdamW", "schedule": "constant",
                "budget": "steps of epochs x the full-label train split"}


def rowset_key(unit_key: str, fraction: float, params: LoraParams) -> str:
    """A LoRA row-set's key: the frozen grid unit's key (every feature, split, label and probe input), the
    label fraction and every field of the (resolved) fine-tune parameters."""
    return content_key(stage=STAGE, unit=unit_key, fraction=fraction, epochs=params.epochs, **params.training())


# --------------------------------------------------------------------------- the fine-tuned model

@dataclass
class FineTuned:
    """An encoder with trained adapters and its linear head; ``predict_proba`` of an embedding is the
    head's probabilities, so the grid unit scores it like a probe."""

    encoder: object  # the adapted copy of the encoder
    head: nn.Linear
    task: str
    params: LoraParams
    key: str | None = None  # the checkpoint key (finetune's), None for a bare train()
    steps: int = 0  # the optimiser steps the adapters and head were trained for
    train_seconds: float = np.nan
    images_per_second: float = np.nan
    resumed_from: int = 0
    fit_seconds_: float = field(init=False, default=np.nan)

    def __post_init__(self):
        self.fit_seconds_ = self.train_seconds

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """The adapters' and the head's weights (what a checkpoint holds)."""
        return {**_adapter_state(self.encoder.model), **{f"head.{k}": v for k, v in self.head.state_dict().items()}}

    def predict_proba(self, embeddings: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            logits = self.head(torch.as_tensor(embeddings, dtype=torch.float32, device=self.head.weight.device))
        return _probabilities(logits, self.task).cpu().numpy()


def _probabilities(logits: torch.Tensor, task: str) -> torch.Tensor:
    return logits.softmax(dim=1) if task == "multiclass" else logits.sigmoid()


def _loss(logits: torch.Tensor, y: torch.Tensor, task: str) -> torch.Tensor:
    if task == "multiclass":
        return nn.functional.cross_entropy(logits, y)
    seen = ~torch.isnan(y)  # uncertain CheXpert labels (u_policy ignore) are masked
    per = nn.functional.binary_cross_entropy_with_logits(logits, torch.nan_to_num(y), reduction="none")
    return (per * seen).sum() / seen.sum().clamp(min=1)


def _adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items() if "lora_" in k}


def base_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The weights and buffers of a network without its LoRA adapters, named as in the unadapted network
    (peft's ``base_layer.`` level removed), for the bit-for-bit check that the base is frozen."""
    return {k.replace("base_layer.", ""): v.detach().clone() for k, v in model.state_dict().items() if "lora_" not in k}


def adapt(encoder, params: LoraParams = LoraParams(), *, seed: int = 0):
    """A copy of ``encoder`` with LoRA adapters injected (peft) as ``params`` say, its base frozen; the
    encoder is untouched.

    The adapters' initialisation is seeded by ``seed`` (peft: A random, B zero, so the adapted network
    starts equal to the base).
    """
    from peft import LoraConfig, inject_adapter_in_model

    params = params.resolved(encoder)
    adapted = copy.deepcopy(encoder)
    config = LoraConfig(r=params.rank, lora_alpha=params.alpha, lora_dropout=params.dropout,
                        target_modules=list(params.target_modules), bias="none")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        inject_adapter_in_model(config, adapted.model)
    for name, p in adapted.model.named_parameters():
        p.requires_grad_("lora_" in name)
    adapted.model.eval()
    return adapted


def _embed(encoder, x_uint8: torch.Tensor) -> torch.Tensor:
    """The ``final`` embedding with gradients (the encoder's own tap, so LoRA and the frozen probe read
    the same layer); bf16 autocast on a GPU."""
    x = encoder.preprocess(x_uint8.to(encoder.device, non_blocking=True))
    if encoder.device.type != "cuda":
        return encoder._forward_layers(x, (FINAL,))[FINAL].float()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        return encoder._forward_layers(x.contiguous(memory_format=torch.channels_last), (FINAL,))[FINAL].float()


def _load_images(spec, images: pd.DataFrame, conditions, canonical_size, batch_size: int = 64, num_workers: int = 0):
    """``uint8 [N, C, 3, S, S]``: every image under every condition, resized for ``spec`` (the feature
    extractor's own dataset, :class:`crsrepro.extract.features.ConditionedImages`)."""
    from torch.utils.data import DataLoader

    from crsrepro.extract.features import ConditionedImages

    data = ConditionedImages(images["image_id"].astype(str).tolist(), images["path"].astype(str).tolist(),
                             conditions=conditions, canonical_size=canonical_size, spec=spec)
    return torch.cat(list(DataLoader(data, batch_size=batch_size, num_workers=num_workers)))


def train(adapted, images: torch.Tensor, labels: np.ndarray, *, task: str, n_outputs: int, seed: int,
          params: LoraParams = LoraParams(), steps_per_epoch: int | None = None, checkpoint_dir: Path | None = None,
          key: str | None = None) -> FineTuned:
    """Train the adapters of ``adapted`` (from :func:`adapt`) and a linear head on ``images`` (uint8
    ``[N, 3, S, S]``) for ``params.epochs * steps_per_epoch`` optimiser steps, resuming from the last
    checkpoint in ``checkpoint_dir``.

    ``steps_per_epoch`` is the steps of one pass over the full-label train split (:meth:`LoraParams.budget`;
    default: one pass over ``images``), so every label fraction of a cell trains for the same number of
    steps; a checkpoint is written every ``steps_per_epoch`` steps and at the end. The head is initialised
    under ``seed``; the batches are one stream over passes ``p = 0, 1, ...``, pass ``p`` visiting the
    images in the order ``numpy.random.default_rng([seed, p]).permutation(N)`` in batches of
    ``params.batch_size`` (the last of a pass smaller), and a step sums the gradients of
    ``params.accumulation_steps`` consecutive batches. ``key`` (the checkpoint key) is recorded on the result.
    """
    device, batch_size, accumulate = adapted.device, params.batch_size, params.accumulation_steps
    steps_per_epoch = steps_per_epoch or params.steps_per_epoch(len(images))
    total = params.epochs * steps_per_epoch
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = nn.Linear(adapted.spec.embed_dim, n_outputs).to(device)
    trainable = [p for p in adapted.model.parameters() if p.requires_grad] + list(head.parameters())
    optimiser = torch.optim.AdamW(trainable, lr=params.lr, weight_decay=params.weight_decay)
    y_all = torch.as_tensor(labels, dtype=torch.long if task == "multiclass" else torch.float32)
    start = 0
    if checkpoint_dir is not None:
        done = sorted(int(p.stem.split("_")[1]) for p in Path(checkpoint_dir).glob("step_*.pt"))
        done = [k for k in done if k <= total]
        if done:
            start = done[-1]
            saved = torch.load(Path(checkpoint_dir) / f"step_{start}.pt", weights_only=True, map_location=device)
            adapted.model.load_state_dict(saved["adapters"], strict=False)
            head.load_state_dict(saved["head"])
            optimiser.load_state_dict(saved["optimizer"])
    per_pass = math.ceil(len(images) / batch_size)

    def batch(b: int) -> np.ndarray:  # the b-th batch of the stream
        order = np.random.default_rng([seed, b // per_pass]).permutation(len(images))
        return order[(b % per_pass) * batch_size:(b % per_pass + 1) * batch_size]

    started, seen = time.perf_counter(), 0
    for step in range(start, total):
        optimiser.zero_grad(set_to_none=True)
        for b in range(step * accumulate, (step + 1) * accumulate):
            idx = batch(b)
            logits = head(_embed(adapted, images[idx]))
            (_loss(logits, y_all[idx].to(device), task) / accumulate).backward()
            seen += len(idx)
        optimiser.step()
        done_steps = step + 1
        if checkpoint_dir is not None and (done_steps % steps_per_epoch == 0 or done_steps == total):
            state = {"step": done_steps, "adapters": _adapter_state(adapted.model), "head": head.state_dict(),
                     "optimizer": optimiser.state_dict()}
            atomic_write(Path(checkpoint_dir) / f"step_{done_steps}.pt", lambda f: torch.save(state, f))
    seconds = time.perf_counter() - started
    head.eval()
    return FineTuned(adapted, head, task, params, key, steps=total, train_seconds=seconds,
                     images_per_second=seen / seconds if seen else np.nan, resumed_from=start)


@dataclass(frozen=True)
class StepCheck:
    """What two optimiser steps on one batch did to an adapted network (:func:`step_check`).

    Attributes
    ----------
    adapters : list of str
        The adapted modules.
    dead : list of str
        The adapters whose ``lora_B`` got no gradient at the first step, or whose ``lora_A`` got none at
        the second (B starts at zero, so A's first gradient is zero by construction): they train nothing.
    base_changed : list of str
        The tensors of the frozen base that are not bit for bit what they were.
    """

    adapters: list
    dead: list
    base_changed: list


def step_check(encoder, images: torch.Tensor, labels: np.ndarray, *, task: str, n_outputs: int,
               params: LoraParams = LoraParams(), seed: int = 0) -> StepCheck:
    """Adapt ``encoder`` (:func:`adapt`) and take two optimiser steps on ``images`` (uint8, resized for
    it), as :func:`train` does, recording which adapters received a gradient and whether the frozen base
    stayed unchanged: the proof that an encoder's LoRA targets train (``tests/test_lora_targets.py``)."""
    adapted = adapt(encoder, params, seed=seed)
    before = base_state(adapted.model)
    embedding = _embed(adapted, images)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = nn.Linear(embedding.shape[1], n_outputs).to(adapted.device)  # a shrunk stand-in's width
    lora = {name: p for name, p in adapted.model.named_parameters() if "lora_" in name}
    optimiser = torch.optim.AdamW(list(lora.values()) + list(head.parameters()), lr=params.lr)
    y = torch.as_tensor(labels, dtype=torch.long if task == "multiclass" else torch.float32)
    moved = {}
    for factor in ("lora_B", "lora_A"):
        optimiser.zero_grad(set_to_none=True)
        embedding = embedding if factor == "lora_B" else _embed(adapted, images)
        _loss(head(embedding), y.to(adapted.device), task).backward()
        for name, p in lora.items():
            if f".{factor}." in name:
                moved[name.split(f".{factor}.")[0]] = moved.get(name.split(f".{factor}.")[0], True) and (
                    p.grad is not None and bool(p.grad.abs().sum() > 0))
        optimiser.step()
    after, targets = base_state(adapted.model), list(params.resolved(encoder).target_modules)
    return StepCheck(adapters=targets, dead=sorted(t for t in targets if not moved.get(t, False)),
                     base_changed=sorted(k for k in before if not torch.equal(before[k], after[k])))


# --------------------------------------------------------------------------- one fine-tune

def finetune(encoder_id: str, dataset: str, seed: int, *, params: LoraParams = LoraParams(), label_fraction: float = 1.0,
             profile: Profile | str = "demo", output_dir: Path | None = None, manifest_dir: Path | None = None,
             view=None, encoder=None, progress: bool = False) -> FineTuned:
    """Fine-tune ``encoder_id`` on ``dataset`` with LoRA for one seed and label fraction.

    Parameters
    ----------
    encoder_id, dataset : str
    seed : int
        One of the profile's seeds: its train split, label subsets, adapter and head initialisation.
    params : LoraParams
        What the fine-tune trains with; its fields (with the data's) are the checkpoint key.
    label_fraction : float
        One of the profile's label fractions: the seed's label subset of the train split.
    profile : Profile or str
    output_dir : path, optional
        The results folder (default: the profile's); checkpoints go under ``lora/checkpoints/``.
    manifest_dir : path, optional
    view, encoder : optional
        A prepared dataset (:func:`crsrepro.run.views.prepare_view`) and a built encoder, to reuse across calls.
    progress : bool

    Returns
    -------
    FineTuned

    Raises
    ------
    LoraError
        The seed or the label fraction is not the profile's, or the encoder has no declared targets.
    """
    from crsrepro.data.manifests import label_subsets
    from crsrepro.encoders import create_encoder

    profile = as_profile(profile)
    if seed not in profile.seeds or label_fraction not in profile.label_fractions:
        raise LoraError(f"profile {profile.name!r}: seed {seed} / label fraction {label_fraction} not among its "
                        f"seeds {profile.seeds} / fractions {profile.label_fractions}")
    view = view or views.prepare_view(profile, dataset, manifest_dir, progress)
    encoder = encoder or create_encoder(encoder_id, device=profile.features.device)
    params = params.resolved(encoder)
    train_rows, _ = view.seed_rows[seed]
    split = view.pool.take(train_rows)
    subset = label_subsets(split.labels, fractions=profile.label_fractions, seed=seed, task=view.task)[label_fraction]
    key = content_key(stage=f"{STAGE}-train", encoder=encoder_id, weights=encoder.weights_hash,
                      preprocessing=encoder.spec.preprocessing, images=view.images_key, seed=seed,
                      seed_split=view.seed_hash[seed], rows=content_key(rows=train_rows[subset].tolist()),
                      labels=labels_key(split.labels[subset]), version=CACHE_VERSION, **params.training())
    images = _load_images(encoder.spec, split.images.iloc[subset], (CLEAN,), None)[:, 0]
    adapted = adapt(encoder, params, seed=seed)
    checkpoints = Path(output_dir or profile.output_path) / STAGE / "checkpoints" / key
    return train(adapted, images, split.labels[subset], task=view.task, n_outputs=len(view.label_names), seed=seed,
                 params=params, steps_per_epoch=params.steps_per_epoch(len(train_rows)), checkpoint_dir=checkpoints,
                 key=key)


def _embeddings(fine: FineTuned, requests: dict, val_rows: np.ndarray, batch_size: int) -> dict:
    """The grid's feats dict, from the fine-tuned network: test (every condition), transfers (clean), and
    of the pool only the val rows (what recalibration reads; the train rows stay NaN, unread)."""
    from crsrepro.extract.features import forward_batch

    out = {}
    for name, r in requests.items():
        images = r.images.iloc[val_rows] if name == "pool" else r.images
        stack = _load_images(fine.encoder.spec, images, r.conditions, r.canonical_size, batch_size)
        by_condition = {c: np.concatenate([forward_batch(fine.encoder, stack[i:i + batch_size, j], (FINAL,))[FINAL]
                                           .float().cpu().numpy() for i in range(0, len(stack), batch_size)])
                        for j, c in enumerate(r.conditions)}
        out[name] = by_condition if name == "test" else by_condition[CLEAN]
    pool = np.full((len(requests["pool"].images), out["pool"].shape[1]), np.nan, np.float32)
    pool[val_rows] = out["pool"]
    out["pool"] = pool
    return out


def score(fine: FineTuned, profile: Profile, view, seed: int, label_fraction: float) -> tuple[pd.DataFrame, dict]:
    """The fine-tuned model's tidy rows (``regime="lora"``) on every condition, and its per-case arrays."""
    from crsrepro.encoders import get_encoder_spec

    unit = Unit(profile, get_encoder_spec(fine.encoder.spec.id), view, seed, LINEAR)
    feats = _embeddings(fine, feature_requests(profile, view), unit.val_rows, profile.features.batch_size)
    cases = {}
    rows = pd.DataFrame(unit.score(label_fraction, fine, feats, cases)).assign(regime=LORA)
    return rows, cases


# --------------------------------------------------------------------------- the LoRA grid

def default_cells(profile: Profile | str) -> list[tuple[str, str]]:
    """The (encoder, dataset) cells the profile fine-tunes: its cells of the LoRA-adaptable encoders
    (:func:`adaptable`) that its ``lora.exclude`` does not leave out; none when no encoder is left (for
    ``paper``: all 43 cells, the paper's LoRA experiment, DESIGN.md section 11)."""
    from crsrepro.run.grid import cells as grid_cells

    profile = as_profile(profile)
    encoders = [e for e in adaptable(profile.encoders) if e not in profile.lora.exclude]
    log.info("lora: the cells of %s; left out: %s (not adaptable or excluded by the plan)",
             encoders, sorted(set(profile.encoders) - set(encoders)))
    return grid_cells(profile, encoders) if encoders else []




def _unit_key(profile: Profile, spec, view, seed: int, feature_keys: dict) -> str:
    return Unit(profile, spec, view, seed, LINEAR).key(feature_keys)


@dataclass(frozen=True)
class _CellTask:
    """The inputs of one LoRA task: a cell, the (seed, fraction, key) of its row-sets not done yet, and
    what the planning process saw of the dataset."""

    profile: Profile
    encoder: str
    dataset: str
    manifest_dir: Path | None
    images_key: str
    params: LoraParams
    todo: tuple
    output_dir: Path  # the profile's results folder: the row-sets go to lora/, the checkpoints to lora/checkpoints/


def _cell_task(task: _CellTask) -> str:
    """LoRA task: fine-tune, score and write each pending (seed, fraction) of one cell."""
    from crsrepro.encoders import get_encoder_spec

    profile = task.profile
    prepared = views.view(profile, task.dataset, task.manifest_dir, task.images_key)
    built = units.encoder(task.encoder, None, profile.features.device)
    params, spec = task.params.resolved(built), get_encoder_spec(task.encoder)
    feature_keys = layer_feature_keys(built, feature_requests(profile, prepared))
    store, provenance = ResultStore(task.output_dir / STAGE), {"crsrepro": __version__, "git": git_hash()}
    for seed, fraction, key in task.todo:
        if rowset_key(_unit_key(profile, spec, prepared, seed, feature_keys), fraction, params) != key:
            raise CrsreproError(f"lora {task.encoder} {task.dataset} seed {seed} fraction {fraction}: this worker "
                                f"derives another row-set key than the planning process (other data or code?)")
        fine = finetune(task.encoder, task.dataset, seed, params=params, label_fraction=fraction, profile=profile,
                        output_dir=task.output_dir, view=prepared, encoder=built)
        rows, cases = score(fine, profile, prepared, seed, fraction)
        rows["rowset"] = key
        rows.attrs = {**provenance, "key": key, "train_key": fine.key, "steps": fine.steps,
                      "images_per_second": fine.images_per_second}
        if cases:
            store.write_cases(key, case_arrays(prepared, cases))
        store.write(key, rows)
        log.info("lora: %s %s seed %d fraction %s: %d steps, %.1f img/s", task.encoder, task.dataset, seed,
                 fraction, fine.steps, fine.images_per_second)
    return f"lora {task.encoder} {task.dataset}"


@dataclass(frozen=True)
class LoraStage:
    """The LoRA grid as a stage (:class:`crsrepro.run.stages.Stage`), into ``<output_dir>/lora/``: every
    (cell, seed, fraction) of the profile's ``lora`` plan.

    Parameters
    ----------
    cells : tuple of (encoder id, dataset), optional
        Default: :func:`default_cells` of the profile.
    seeds : tuple of int, optional
        Default: the profile's first ``lora.n_seeds`` seeds.
    fractions : tuple of float, optional
        Default: the profile's ``lora.label_fractions`` that are among its label fractions.
    params : LoraParams, optional
        Default: :class:`LoraParams` with the profile's ``lora.epochs``.
    output_dir : path, optional
        The profile's results folder (default: its ``output_dir``).
    manifest_dir : path, optional
    """

    cells: tuple | None = None
    seeds: tuple | None = None
    fractions: tuple | None = None
    params: LoraParams | None = None
    output_dir: Path | None = None
    manifest_dir: Path | None = None
    name: ClassVar[str] = STAGE
    command: ClassVar[str] = "crsrepro book"

    def lora_params(self, profile: Profile) -> LoraParams:
        """What every fine-tune of the stage trains with."""
        return self.params or LoraParams(epochs=profile.lora.epochs)

    def store(self, profile: Profile) -> ResultStore:
        return ResultStore(self._root(profile) / STAGE)

    def _root(self, profile: Profile) -> Path:
        return Path(self.output_dir or profile.output_path)

    def plan(self, profile: Profile, store: ResultStore, *, progress: bool = False) -> tuple[list[str], list[Task]]:
        """Every (cell, seed, fraction)'s key, in that order, and one task per cell with a row-set left to
        write (planning builds the encoders on the CPU: the keys need only their weights hash).

        Raises
        ------
        LoraError
            An encoder of the cells has no declared LoRA targets.
        """
        from crsrepro.encoders import get_encoder_spec

        chosen = default_cells(profile) if self.cells is None else [tuple(cell) for cell in self.cells]
        seeds = list(self.seeds or profile.seeds[:profile.lora.n_seeds])
        fractions = list(self.fractions or [f for f in profile.lora.label_fractions if f in profile.label_fractions])
        params = self.lora_params(profile)
        keys, tasks = [], []
        for encoder_id, dataset in chosen:
            prepared = views.view(profile, dataset, self.manifest_dir)
            built = units.encoder(encoder_id, None, "cpu")
            resolved, spec = params.resolved(built), get_encoder_spec(encoder_id)
            feature_keys = layer_feature_keys(built, feature_requests(profile, prepared))
            todo = []
            for seed in seeds:
                unit_key = _unit_key(profile, spec, prepared, seed, feature_keys)
                for fraction in fractions:
                    key = rowset_key(unit_key, fraction, resolved)
                    keys.append(key)
                    if not store.has(key):
                        todo.append((seed, fraction, key))
            if todo:
                tasks.append(Task(f"lora:{encoder_id}:{dataset}", _cell_task,
                                  (_CellTask(profile, encoder_id, dataset, self.manifest_dir, prepared.images_key, params,
                                             tuple(todo), self._root(profile)),), gpu=holds_gpu(profile),
                                  stage="LoRA"))
        return keys, tasks

    def attrs(self, profile: Profile) -> dict:
        return {"profile": profile.name, "profile_fingerprint": profile.fingerprint(),
                "epochs": self.lora_params(profile).epochs}


__all__ = ["FineTuned", "LoraError", "LoraParams", "LoraStage", "STAGE", "StepCheck", "adapt", "adaptable",
           "base_state", "default_cells", "finetune", "lora_targets", "rowset_key",
           "score", "step_check", "train"]
