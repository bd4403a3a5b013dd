"""LoRA fine-tuning as the ``regime="lora"`` axis of the run grid (DESIGN.md section 11).

:func:`finetune` adapts one encoder to one dataset for one seed and label fraction: peft LoRA adapters
(the paper's rank 8, alpha 16) on the modules :func:`lora_targets` names (:mod:`crsrepro.encoders.lora_targets`:
the attention projections of transformers, the MLP of CLIP-style blocks, the ``Conv2d`` layers of CNNs)
and a linear head on the ``final`` embedding. One recipe holds for every encoder, dataset and label
fraction, **[ours]** (the paper gives rank, alpha, 8 epochs and 3 seeds, not the recipe): *linear probe,
then fine-tune*.

1. **The head starts where the frozen probe ends.** The grid's row-sets keep no probe weights, so the LoRA
   task refits the grid's linear probe of the same (encoder, dataset, seed) with the grid's own function
   (:meth:`crsrepro.run.units.Unit.fit`, :func:`crsrepro.fit.linear.fit_linear_probes`: the same ``final``
   features of the pool from the feature cache, the same C rule and thread count, so the same C and
   weights; :func:`frozen_probes`), and :class:`ProbeHead` carries it into torch: the probe's
   standardisation (its train split's mean and scale, fixed buffers) and its linear map (trained). The
   adapters start at zero (peft's B = 0), so at step 0 the fine-tuned model *is* the frozen probe: its
   probabilities equal the probe's (``tests/test_lora.py``: to 1e-5).
2. **Warm-up, then a decaying learning rate.** AdamW; the learning rate rises linearly over the first
   ``warmup_epochs`` epochs and then follows a cosine to zero at the end of the budget
   (:meth:`LoraParams.learning_rate`, a function of the step alone).
3. **A fixed optimiser-step budget**, the steps of ``epochs`` passes over the seed's *full-label* train
   split, so that a fine-tune on 1 % of the labels may take as many steps as one on all of them and
   retention after LoRA does not mix the amount of data with the training budget (:meth:`LoraParams.budget`).
4. **Early stopping on val.** After every epoch's steps the model is scored on the val rows that chose the
   probe's C (the fraction's nested val subset, DESIGN.md section 3): macro AUROC, a tie going to the lower
   log-loss (:func:`crsrepro.fit.linear.choose_c`, the probe's own rule). The frozen start is epoch 0;
   training stops after ``patience`` epochs without a new best, and the best epoch is restored
   (:func:`best_epoch`), so a fine-tune never ends worse on val than the probe it started from. The rows
   record the epoch restored and the val AUROC at epoch 0 and at it (:data:`TRAINING_METRICS`).

Everything a fine-tune trains with is one :class:`LoraParams`, and its fields (with :data:`VERSION`)
derive the keys, so a changed default is never served a stale row-set or checkpoint. The base network
stays in eval mode (BatchNorm statistics and dropout frozen [ours]), its weights never receive a
gradient and are unchanged bit for bit; only the adapters and the head train. :func:`step_check` proves
it per encoder (every adapter gets a gradient, the base is unchanged).

It trains on the seed's train split at the label fraction (the grid's label subsets,
:class:`crsrepro.run.units.Unit`), clean images at their stored size, like the frozen probe's pool.
After every epoch the adapters, the head, the optimiser state and the val history are saved under
``<output_dir>/lora/checkpoints/<key>/step_<k>.pt`` (atomically; the last epoch's and the best epoch's
are kept); a killed run resumes from the last one, and since the batch stream is a function of the seed
alone (pass ``p`` visits the labelled images in the order ``default_rng([seed, p])``) and the learning
rate a function of the step, the resumed run ends with the same weights as an uninterrupted one (on the
same device).

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
from crsrepro.core.vocab import CLEAN, LINEAR, NO_RECALIBRATION
from crsrepro.profiles import Profile, as_profile
from crsrepro.run import units, views
from crsrepro.run.executor import Task
from crsrepro.run.results import ResultStore
from crsrepro.run.stages import holds_gpu
from crsrepro.run.units import Unit, case_arrays, feature_requests, labels_key, layer_feature_keys

log = logging.getLogger(__name__)

STAGE = "lora"
#: The version of what a fine-tune computes beyond its :class:`LoraParams` fields (the head's start, the
#: schedule's shape, the early-stopping rule, the training metrics); it enters both keys. 2: linear
#: probe, then fine-tune (issue 27.2); 3: the checkpoint key names the head's starting weights
#: (:func:`probe_weights_key`), so checkpoints trained from another probe are never resumed; 4: the val
#: log-loss that breaks AUROC ties between epochs is computed in float64 (the head's float32
#: probabilities gave log(0) and NaN); 5: the fine-tuned network is scored with its adapters merged into the
#: base weights (:func:`merged`; embeddings within float32 rounding of the unmerged ones).
VERSION = 5
#: The metrics a LoRA row-set adds on its clean, unrecalibrated row: the epoch early stopping restored
#: (0: the frozen probe), the epochs trained before it stopped, and the val macro AUROC at epoch 0 and at
#: the epoch restored.
TRAINING_METRICS = ("best_epoch", "epochs_trained", "val_auroc_start", "val_auroc_best")


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
    """What one fine-tune trains with (DESIGN.md section 11; the recipe is the module docstring's).
    :func:`finetune` receives it, and its fields derive the checkpoint key (:meth:`training`) and the
    row-set key (:func:`rowset_key`).

    Attributes
    ----------
    epochs : int
        The budget, the same for every encoder and label fraction: at most the optimiser steps of
        ``epochs`` passes over the seed's *full-label* train split (:meth:`budget`; the paper: 8 epochs; a
        profile's ``lora.epochs``). [ours] a fixed step budget, so that a small label fraction is not also
        a small training budget (at 1 % of APTOS, 8 epochs of its labelled images would be 8 steps).
    warmup_epochs : int
        [ours] The epochs over which the learning rate rises linearly to ``lr`` (then a cosine decays it
        to zero at the end of the budget, :meth:`learning_rate`): 1.
    patience : int
        [ours] Training stops after this many epochs without a new best val score (the best epoch is
        restored, :func:`best_epoch`): 3, so that the paper's 8 epochs stop early only after a plateau.
    rank, alpha : int
        LoRA rank and scaling (the paper: 8 and 16).
    dropout : float
        [ours] Dropout on the adapters: none, the paper names none.
    lr, weight_decay : float
        [ours] AdamW's peak learning rate, 1e-3, and AdamW's default weight decay.
    batch_size : int
        [ours] 32 on the CPU; the GPU protocol uses 128 (``benchmarks/lora.py``).
    accumulation_steps : int
        Batches whose gradients are summed before a step (the GPU path's large effective batch).
    target_modules : tuple of str, optional
        The adapted modules' full names; None: the encoder's declared targets (:func:`lora_targets`).
    """

    epochs: int = 8
    warmup_epochs: int = 1
    patience: int = 3
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
        whatever its label fraction: ``epochs`` passes over the full split (fewer when early stopping
        ends it).

        >>> LoraParams(epochs=8, batch_size=32).budget(100)
        32
        """
        return self.epochs * self.steps_per_epoch(n_train)

    def learning_rate(self, step: int, steps_per_epoch: int) -> float:
        """The learning rate of optimiser step ``step`` (0-based) of a budget of ``epochs`` epochs of
        ``steps_per_epoch`` steps: ``lr * (step + 1) / W`` over the first ``W = warmup_epochs *
        steps_per_epoch`` steps, then ``lr * (1 + cos(pi * (step - W) / (budget - W))) / 2``.

        >>> p = LoraParams(epochs=3, warmup_epochs=1, lr=1.0)
        >>> [round(p.learning_rate(s, 2), 3) for s in range(6)]
        [0.5, 1.0, 1.0, 0.854, 0.5, 0.146]
        """
        warmup, total = self.warmup_epochs * steps_per_epoch, self.epochs * steps_per_epoch
        if step < warmup:
            return self.lr * (step + 1) / warmup
        return self.lr * (1 + math.cos(math.pi * (step - warmup) / (total - warmup))) / 2

    def training(self) -> dict:
        """What decides the weights after each step: every field (the budget too, since the learning rate
        decays to zero at its end), with the head's start, the optimiser, schedule, budget and
        early-stopping rule that :func:`train` implements, and :data:`VERSION`."""
        if self.target_modules is None:
            raise LoraError("LoRA parameters without target modules: resolve them for an encoder first")
        return {**dataclasses.asdict(self), "target_modules": list(self.target_modules), "version": VERSION,
                "head": "the frozen linear probe", "optimiser": "AdamW",
                "schedule": "linear warm-up, cosine decay to zero", "budget": "steps of epochs x the full-label train split",
                "early_stopping": "val macro AUROC, ties to the lower log-loss, epoch 0 the probe, best restored"}


def rowset_key(unit_key: str, fraction: float, params: LoraParams) -> str:
    """A LoRA row-set's key: the frozen grid unit's key (every feature, split, label and probe input), the
    label fraction and every field of the (resolved) fine-tune parameters."""
    return content_key(stage=STAGE, unit=unit_key, fraction=fraction, **params.training())


# --------------------------------------------------------------------------- the fine-tuned model

def probe_weights_key(probe) -> str:
    """The digest of a fitted linear probe's weights and standardisation, the fine-tune's starting head: a
    checkpoint is resumed only by a fine-tune that starts from the same head. Its other inputs (features,
    parameters, val rows) do not pin the weights down, since how the probe is solved (for instance
    :data:`crsrepro.fit.linear.FINISH_FACTOR`) is code, not a parameter."""
    import hashlib

    digest = hashlib.sha256()
    for name in ("coef_", "intercept_", "mean_", "scale_"):
        digest.update(np.ascontiguousarray(getattr(probe, name), dtype=np.float64).tobytes())
    return digest.hexdigest()


class ProbeHead(nn.Module):
    """A fitted :class:`crsrepro.fit.linear.LinearProbe` as a torch head on the ``final`` embedding: the
    probe's standardisation (``mean_``, ``scale_``: fixed buffers) and its linear map on the standardised
    features (``linear``: trained), so that its logits start as the probe's. A two-class multinomial probe
    (one coefficient row and a sigmoid) becomes the rows ``[0, w]``, whose softmax is its ``[1 - p, p]``."""

    def __init__(self, probe):
        super().__init__()
        coef, intercept = np.asarray(probe.coef_, dtype=np.float64), np.asarray(probe.intercept_, dtype=np.float64)
        if probe.task == "multiclass" and probe.n_classes_ == 2:
            coef, intercept = np.vstack([np.zeros_like(coef), coef]), np.concatenate([[0.0], intercept])
        self.register_buffer("mean", torch.as_tensor(probe.mean_, dtype=torch.float32))
        self.register_buffer("scale", torch.as_tensor(probe.scale_, dtype=torch.float32))
        self.linear = nn.Linear(coef.shape[1], coef.shape[0])
        with torch.no_grad():
            self.linear.weight.copy_(torch.as_tensor(coef))
            self.linear.bias.copy_(torch.as_tensor(intercept))

    def forward(self, embedding: torch.Tensor) -> torch.Tensor:
        return self.linear((embedding - self.mean) / self.scale)


@dataclass
class FineTuned:
    """An encoder with trained adapters and its linear head; ``predict_proba`` of an embedding is the
    head's probabilities, so the grid unit scores it like a probe.

    ``history`` holds the (val macro AUROC, val log-loss) of every epoch evaluated, epoch 0 the frozen
    start; ``best_epoch`` is the epoch whose weights the adapters and the head hold (:func:`best_epoch`).
    ``C_`` is the C of the probe the head started from (the grid's, recorded in the rows' ``probe_C``)."""

    encoder: object  # the adapted copy of the encoder
    head: nn.Module
    task: str
    params: LoraParams
    key: str | None = None  # the checkpoint key (finetune's), None for a bare train()
    steps: int = 0  # the optimiser steps taken before training ended (the budget, or fewer: early stopping)
    history: list = field(default_factory=list)
    best_epoch: int = 0
    C_: float = np.nan
    train_seconds: float = np.nan
    images_per_second: float = np.nan
    resumed_from: int = 0
    fit_seconds_: float = field(init=False, default=np.nan)

    def __post_init__(self):
        self.fit_seconds_ = self.train_seconds

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """The adapters' and the head's weights (what a checkpoint holds)."""
        return {**_adapter_state(self.encoder.model), **{f"head.{k}": v for k, v in self.head.state_dict().items()}}

    def training_metrics(self) -> dict[str, float]:
        """:data:`TRAINING_METRICS` of this fine-tune (NaN without a val history)."""
        if not self.history:
            return dict.fromkeys(TRAINING_METRICS, np.nan)
        return {"best_epoch": self.best_epoch, "epochs_trained": len(self.history) - 1,
                "val_auroc_start": self.history[0][0], "val_auroc_best": self.history[self.best_epoch][0]}

    def predict_proba(self, embeddings: np.ndarray) -> np.ndarray:
        return _head_probabilities(self.head, self.task, embeddings)


def _head_probabilities(head: nn.Module, task: str, embeddings: np.ndarray) -> np.ndarray:
    device = next(head.parameters()).device
    with torch.inference_mode():
        logits = head(torch.as_tensor(embeddings, dtype=torch.float32, device=device))
    return _probabilities(logits, task).cpu().numpy()


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


def base_changes(model: nn.Module, before: dict[str, torch.Tensor]) -> list[str]:
    """The base tensors of ``model`` that differ from ``before`` (its :func:`base_state`, taken earlier), the
    network read once (the dry run's check read it once per tensor: quadratic in its size)."""
    after = base_state(model)
    return sorted(k for k in before if not torch.equal(before[k], after[k]))


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


def _features(encoder, images: torch.Tensor, batch_size: int) -> np.ndarray:
    """``float32 [N, D]``: the ``final`` embeddings of ``images`` (uint8 ``[N, 3, S, S]``) without gradients,
    through the feature extractor's own forward (:func:`crsrepro.extract.features.forward_batch`), as the
    frozen probe's features were computed."""
    from crsrepro.extract.features import forward_batch

    return np.concatenate([forward_batch(encoder, images[i:i + batch_size], (FINAL,))[FINAL].float().cpu().numpy()
                           for i in range(0, len(images), batch_size)])


def _load_images(spec, images: pd.DataFrame, conditions, canonical_size, batch_size: int = 64, num_workers: int = 0):
    """``uint8 [N, C, 3, S, S]``: every image under every condition, resized for ``spec`` (the feature
    extractor's own dataset, :class:`crsrepro.extract.features.ConditionedImages`)."""
    from torch.utils.data import DataLoader

    from crsrepro.extract.features import ConditionedImages

    data = ConditionedImages(images["image_id"].astype(str).tolist(), images["path"].astype(str).tolist(),
                             conditions=conditions, canonical_size=canonical_size, spec=spec)
    return torch.cat(list(DataLoader(data, batch_size=batch_size, num_workers=num_workers)))


def best_epoch(history) -> int:
    """The epoch early stopping restores from ``history``, the (val macro AUROC, val log-loss) of epochs
    0, 1, ...: the highest AUROC, a tie going to the lower log-loss and then to the earlier epoch
    (:func:`crsrepro.fit.linear.choose_c`, the rule that chose the probe's C); by log-loss alone where no
    epoch's AUROC could be computed (no val class with both outcomes).

    >>> best_epoch([(0.80, 0.5), (0.85, 0.6), (0.85, 0.4), (0.70, 0.3)])
    2
    """
    from crsrepro.fit.linear import choose_c

    auroc, loss = np.asarray(history, dtype=float).T
    if np.isnan(auroc).all():
        return int(np.nanargmin(loss))
    return choose_c(auroc, loss)[0]


def _validate(adapted, head: nn.Module, val, task: str, batch_size: int) -> tuple[float, float]:
    """(val macro AUROC, val log-loss) of the adapted network and head on ``val`` (images, labels)."""
    from crsrepro.core.metrics import macro_auroc
    from crsrepro.fit.linear import log_loss

    images, labels = val
    probs = _head_probabilities(head, task, _features(adapted, images, batch_size))
    return float(macro_auroc(labels, probs, task=task)), log_loss(labels, probs, task=task)


def _checkpoints(checkpoint_dir: Path | None) -> dict[int, Path]:
    """``{step: path}`` of the checkpoints written so far."""
    if checkpoint_dir is None:
        return {}
    return {int(p.stem.split("_")[1]): p for p in Path(checkpoint_dir).glob("step_*.pt")}


def train(adapted, images: torch.Tensor, labels: np.ndarray, *, task: str, seed: int, head: nn.Module | None = None,
          n_outputs: int | None = None, val: tuple | None = None, params: LoraParams = LoraParams(),
          steps_per_epoch: int | None = None, checkpoint_dir: Path | None = None, key: str | None = None) -> FineTuned:
    """Train the adapters of ``adapted`` (from :func:`adapt`) and ``head`` on ``images`` (uint8
    ``[N, 3, S, S]``) for at most ``params.epochs * steps_per_epoch`` optimiser steps, resuming from the
    last checkpoint in ``checkpoint_dir`` (the recipe: the module docstring).

    Parameters
    ----------
    adapted, images, labels, task
    seed : int
        The batch stream: pass ``p`` visits the images in the order
        ``numpy.random.default_rng([seed, p]).permutation(N)`` in batches of ``params.batch_size`` (the
        last of a pass smaller); a step sums the gradients of ``params.accumulation_steps`` consecutive
        batches. Also seeds a random head (``head=None``).
    head : nn.Module, optional
        The head to train, a :class:`ProbeHead` in a fine-tune (changed in place); None: a random
        ``nn.Linear`` with ``n_outputs`` outputs (the dry run's one-step check, which has no probe).
    val : (images, labels), optional
        The val split early stopping scores after every epoch (epoch 0: before any step), restoring the
        best epoch (:func:`best_epoch`); None: no early stopping, the last step's weights.
    params : LoraParams
    steps_per_epoch : int, optional
        The steps of one pass over the full-label train split (:meth:`LoraParams.budget`; default: one
        pass over ``images``), so every label fraction of a cell has the same budget. A checkpoint is
        written after every epoch (``step_<k>.pt``), and every earlier one but the best epoch's removed.
    checkpoint_dir : path, optional
    key : str, optional
        The checkpoint key, recorded on the result.
    """
    device, batch_size, accumulate = adapted.device, params.batch_size, params.accumulation_steps
    steps_per_epoch = steps_per_epoch or params.steps_per_epoch(len(images))
    total = params.epochs * steps_per_epoch
    if head is None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            head = nn.Linear(adapted.spec.embed_dim, n_outputs)
    head = head.to(device)
    trainable = [p for p in adapted.model.parameters() if p.requires_grad] + list(head.parameters())
    optimiser = torch.optim.AdamW(trainable, lr=params.lr, weight_decay=params.weight_decay)
    y_all = torch.as_tensor(labels, dtype=torch.long if task == "multiclass" else torch.float32)

    def state() -> dict:
        return {"adapters": _adapter_state(adapted.model), "head": copy.deepcopy(head.state_dict())}

    best, history, start = state(), [], 0  # epoch 0: the frozen probe and zero adapters
    saved = _checkpoints(checkpoint_dir)
    if saved:
        start = max(saved)
        last = torch.load(saved[start], weights_only=True, map_location=device)
        history = last["history"]
        if history and best_epoch(history) > 0:
            best = torch.load(saved[best_epoch(history) * steps_per_epoch], weights_only=True, map_location=device)
        adapted.model.load_state_dict(last["adapters"], strict=False)
        head.load_state_dict(last["head"])
        optimiser.load_state_dict(last["optimizer"])
    elif val is not None:
        history = [_validate(adapted, head, val, task, batch_size)]
    per_pass = math.ceil(len(images) / batch_size)

    def batch(b: int) -> np.ndarray:  # the b-th batch of the stream
        order = np.random.default_rng([seed, b // per_pass]).permutation(len(images))
        return order[(b % per_pass) * batch_size:(b % per_pass + 1) * batch_size]

    def stopped() -> bool:
        return bool(history) and len(history) - 1 - best_epoch(history) >= params.patience

    started, seen, step = time.perf_counter(), 0, start
    while step < total and not stopped():
        for group in optimiser.param_groups:
            group["lr"] = params.learning_rate(step, steps_per_epoch)
        optimiser.zero_grad(set_to_none=True)
        for b in range(step * accumulate, (step + 1) * accumulate):
            idx = batch(b)
            logits = head(_embed(adapted, images[idx]))
            (_loss(logits, y_all[idx].to(device), task) / accumulate).backward()
            seen += len(idx)
        optimiser.step()
        step += 1
        if step % steps_per_epoch == 0:
            if val is not None:
                history.append(_validate(adapted, head, val, task, batch_size))
                if best_epoch(history) == len(history) - 1:
                    best = state()
            if checkpoint_dir is not None:
                _write_checkpoint(Path(checkpoint_dir), step, {**state(), "optimizer": optimiser.state_dict(),
                                                               "history": history},
                                  keep=best_epoch(history) * steps_per_epoch if history else step)
    seconds = time.perf_counter() - started
    if val is not None:
        adapted.model.load_state_dict(best["adapters"], strict=False)
        head.load_state_dict(best["head"])
    head.eval()
    return FineTuned(adapted, head, task, params, key, steps=step, history=history,
                     best_epoch=best_epoch(history) if history else 0, train_seconds=seconds,
                     images_per_second=seen / seconds if seen else np.nan, resumed_from=start)


def _write_checkpoint(folder: Path, step: int, checkpoint: dict, keep: int) -> None:
    """Write ``step_<step>.pt`` atomically, then remove the earlier ones but ``step_<keep>.pt`` (the best
    epoch's; a kill between the two leaves an extra file, which the next checkpoint removes)."""
    atomic_write(folder / f"step_{step}.pt", lambda f: torch.save(checkpoint, f))
    for other, path in _checkpoints(folder).items():
        if other not in (step, keep):
            path.unlink()


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
    targets = list(params.resolved(encoder).target_modules)
    return StepCheck(adapters=targets, dead=sorted(t for t in targets if not moved.get(t, False)),
                     base_changed=base_changes(adapted.model, before))


# --------------------------------------------------------------------------- one fine-tune

def frozen_probes(profile: Profile, view, encoder, seed: int, fractions=None) -> dict:
    """The grid's linear probes of (``encoder``, dataset, ``seed``), one per label fraction of ``fractions``
    (default: all the profile's), refit: the grid's row-sets keep no probe weights, so this runs the grid's
    own fit (:meth:`crsrepro.run.units.Unit.fit`, the profile's C grid and C rule, with ``probe.num_threads``
    threads) on the same ``final`` features of the pool, read from the feature cache (or extracted into it
    when the grid has not run), and gets the grid's C and weights. Each fraction's probe is fitted on its
    own (the CPU's per-fraction solve), so fitting only the fractions LoRA fine-tunes gives the same probes."""
    from crsrepro.encoders import get_encoder_spec

    unit = Unit(profile, get_encoder_spec(encoder.spec.id), view, seed, LINEAR)
    if fractions is not None:
        unit.fractions = [f for f in unit.fractions if f in set(fractions)]
    pool = units.extract(profile, encoder, {"pool": feature_requests(profile, view)["pool"]}, progress=False)["pool"]
    with units.probe_threads(profile.probe.num_threads):
        return unit.fit({"pool": pool[FINAL]})


def finetune(encoder_id: str, dataset: str, seed: int, *, params: LoraParams = LoraParams(), label_fraction: float = 1.0,
             profile: Profile | str = "demo", output_dir: Path | None = None, manifest_dir: Path | None = None,
             view=None, encoder=None, probe=None, progress: bool = False) -> FineTuned:
    """Fine-tune ``encoder_id`` on ``dataset`` with LoRA for one seed and label fraction, the head starting
    from the frozen linear probe and stopping early on the val rows that chose its C (the module docstring).

    Parameters
    ----------
    encoder_id, dataset : str
    seed : int
        One of the profile's seeds: its train split, label subsets and adapter initialisation.
    params : LoraParams
        What the fine-tune trains with; its fields (with the data's and the probe's) are the checkpoint key.
    label_fraction : float
        One of the profile's label fractions: the seed's label subset of the train split.
    profile : Profile or str
    output_dir : path, optional
        The results folder (default: the profile's); checkpoints go under ``lora/checkpoints/``.
    manifest_dir : path, optional
    view, encoder : optional
        A prepared dataset (:func:`crsrepro.run.views.prepare_view`) and a built encoder, to reuse across calls.
    probe : LinearProbe, optional
        The frozen probe of this seed and fraction (:func:`frozen_probes`, to reuse across fractions);
        default: fitted here.
    progress : bool

    Returns
    -------
    FineTuned

    Raises
    ------
    LoraError
        The seed or the label fraction is not the profile's, or the encoder has no declared targets.
    """
    from crsrepro.encoders import create_encoder, get_encoder_spec

    profile = as_profile(profile)
    if seed not in profile.seeds or label_fraction not in profile.label_fractions:
        raise LoraError(f"profile {profile.name!r}: seed {seed} / label fraction {label_fraction} not among its "
                        f"seeds {profile.seeds} / fractions {profile.label_fractions}")
    view = view or views.prepare_view(profile, dataset, manifest_dir, progress)
    encoder = encoder or create_encoder(encoder_id, device=profile.features.device)
    params = params.resolved(encoder)
    unit = Unit(profile, get_encoder_spec(encoder_id), view, seed, LINEAR)
    probe = probe or frozen_probes(profile, view, encoder, seed, [label_fraction])[label_fraction]
    subset = unit.subsets[label_fraction]
    val_rows = np.arange(len(unit.val_rows)) if unit.val_subsets is None else unit.val_subsets[label_fraction]
    pool_features = layer_feature_keys(encoder, {"pool": feature_requests(profile, view)["pool"]})["pool"][CLEAN]
    key = content_key(stage=f"{STAGE}-train", encoder=encoder_id, weights=encoder.weights_hash,
                      preprocessing=encoder.spec.preprocessing, images=view.images_key, seed=seed,
                      seed_split=view.seed_hash[seed], rows=content_key(rows=unit.train_rows[subset].tolist()),
                      labels=labels_key(unit.train.labels[subset]),
                      probe={"features": pool_features, "params": unit.params(),
                             "val_rows": content_key(rows=unit.val_rows[val_rows].tolist()),
                             "val_labels": labels_key(unit.val.labels[val_rows]), "weights": probe_weights_key(probe)},
                      **params.training())
    images = _load_images(encoder.spec, unit.train.images.iloc[subset], (CLEAN,), None)[:, 0]
    val = (_load_images(encoder.spec, unit.val.images.iloc[val_rows], (CLEAN,), None)[:, 0], unit.val.labels[val_rows])
    adapted = adapt(encoder, params, seed=seed)
    checkpoints = Path(output_dir or profile.output_path) / STAGE / "checkpoints" / key
    fine = train(adapted, images, unit.train.labels[subset], task=view.task, seed=seed, head=ProbeHead(probe), val=val,
                 params=params, steps_per_epoch=params.steps_per_epoch(len(unit.train_rows)),
                 checkpoint_dir=checkpoints, key=key)
    fine.C_ = probe.C_
    return fine


def merged(adapted):
    """A copy of an adapted encoder whose LoRA updates are merged into the base weights (peft's ``merge``):
    the same network in one convolution or matrix product per layer instead of the base and the adapter
    paths. Scoring embeds about 5,000 images per fine-tune on the demo; merged, the TinyCNNs' forward takes
    about half the time (the ViT's 0.9x), with embeddings within float32 rounding (relative 1e-6)."""
    from peft.tuners.lora import LoraLayer

    network = copy.deepcopy(adapted)
    for module in network.model.modules():
        if isinstance(module, LoraLayer):
            module.merge()
    return network


def _embeddings(fine: FineTuned, requests: dict, val_rows: np.ndarray, batch_size: int, stacks: dict) -> dict:
    """The grid's feats dict, from the fine-tuned network (:func:`merged`): test (every condition), transfers
    (clean), and of the pool only the val rows (what recalibration reads; the train rows stay NaN, unread).
    ``stacks`` keeps the loaded test and transfer images, which every fine-tune of a cell embeds."""
    network, out = merged(fine.encoder), {}
    for name, r in requests.items():
        if name == "pool":
            stack = _load_images(fine.encoder.spec, r.images.iloc[val_rows], r.conditions, r.canonical_size, batch_size)
        else:
            if name not in stacks:
                stacks[name] = _load_images(fine.encoder.spec, r.images, r.conditions, r.canonical_size, batch_size)
            stack = stacks[name]
        by_condition = {c: _features(network, stack[:, j], batch_size) for j, c in enumerate(r.conditions)}
        out[name] = by_condition if name == "test" else by_condition[CLEAN]
    pool = np.full((len(requests["pool"].images), out["pool"].shape[1]), np.nan, np.float32)
    pool[val_rows] = out["pool"]
    out["pool"] = pool
    return out


def score(fine: FineTuned, profile: Profile, view, seed: int, label_fraction: float,
          stacks: dict | None = None) -> tuple[pd.DataFrame, dict]:
    """The fine-tuned model's tidy rows (``regime="lora"``) on every condition, with its
    :data:`TRAINING_METRICS` on the clean unrecalibrated row, and its per-case arrays. ``stacks``: the
    test and transfer images already loaded for this dataset and encoder (filled here), to reuse."""
    from crsrepro.encoders import get_encoder_spec

    unit = Unit(profile, get_encoder_spec(fine.encoder.spec.id), view, seed, LINEAR)
    feats = _embeddings(fine, feature_requests(profile, view), unit.val_rows, profile.features.batch_size,
                        {} if stacks is None else stacks)
    cases = {}
    rows = pd.DataFrame(unit.score(label_fraction, fine, feats, cases)).assign(regime=LORA)
    clean = rows[(rows["condition"] == CLEAN) & (rows["recalibrator"] == NO_RECALIBRATION)].iloc[[0]]
    training = [clean.assign(metric=name, value=float(value)) for name, value in fine.training_metrics().items()]
    return pd.concat([rows, *training], ignore_index=True), cases


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
    """LoRA task: fine-tune, score and write each pending (seed, fraction) of one cell (the frozen probes
    of a seed are refit once, :func:`frozen_probes`)."""
    from crsrepro.encoders import get_encoder_spec

    profile = task.profile
    prepared = views.view(profile, task.dataset, task.manifest_dir, task.images_key)
    built = units.encoder(task.encoder, None, profile.features.device)
    params, spec = task.params.resolved(built), get_encoder_spec(task.encoder)
    feature_keys = layer_feature_keys(built, feature_requests(profile, prepared))
    store, provenance = ResultStore(task.output_dir / STAGE), {"crsrepro": __version__, "git": git_hash()}
    probes, stacks = {}, {}
    for seed, fraction, key in task.todo:
        if rowset_key(_unit_key(profile, spec, prepared, seed, feature_keys), fraction, params) != key:
            raise CrsreproError(f"lora {task.encoder} {task.dataset} seed {seed} fraction {fraction}: this worker "
                                f"derives another row-set key than the planning process (other data or code?)")
        if seed not in probes:
            probes[seed] = frozen_probes(profile, prepared, built, seed, [f for s, f, _ in task.todo if s == seed])
        fine = finetune(task.encoder, task.dataset, seed, params=params, label_fraction=fraction, profile=profile,
                        output_dir=task.output_dir, view=prepared, encoder=built, probe=probes[seed][fraction])
        rows, cases = score(fine, profile, prepared, seed, fraction, stacks)
        rows["rowset"] = key
        rows.attrs = {**provenance, "key": key, "train_key": fine.key, "steps": fine.steps,
                      "images_per_second": fine.images_per_second}
        if cases:
            store.write_cases(key, case_arrays(prepared, cases))
        store.write(key, rows)
        log.info("lora: %s %s seed %d fraction %s: %d steps, best epoch %d of %d, %.1f img/s", task.encoder,
                 task.dataset, seed, fraction, fine.steps, fine.best_epoch, len(fine.history) - 1,
                 fine.images_per_second)
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


__all__ = ["FineTuned", "LoraError", "LoraParams", "LoraStage", "ProbeHead", "STAGE", "StepCheck", "TRAINING_METRICS",
           "VERSION", "adapt", "adaptable", "base_changes", "base_state", "best_epoch", "default_cells", "finetune",
           "frozen_probes", "merged", "lora_targets", "rowset_key", "score", "step_check", "train"]
