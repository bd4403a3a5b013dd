"""LoRA fine-tuning as the ``regime="lora"`` axis of the run grid (DESIGN.md section 11, issue 13).

:func:`finetune` adapts one encoder to one dataset for one seed and label fraction: peft LoRA adapters
(rank 8, alpha 16) on the layers :func:`lora_targets` names (the attention projections of
transformers, the ``Conv2d`` layers of CNNs), a linear head on the ``final`` embedding, AdamW at a
constant learning rate, and a *fixed budget per encoder*: the same epochs and batch size for every
encoder [ours]. The base network stays in eval mode (BatchNorm statistics and dropout frozen [ours]),
its weights never receive a gradient and are unchanged bit for bit; only the adapters and the head train.

It trains on the seed's train split at the label fraction (the grid's label subsets,
:class:`crsrepro.run.grid._Unit`), clean images at their stored size, like the frozen probe's pool.
After every epoch the adapters, the head and the optimiser state are saved under
``<output_dir>/lora/checkpoints/<key>/epoch_<k>.pt`` (atomically); a killed run resumes from the last
one, and since each epoch's batch order is a function of (seed, epoch) alone and the learning rate is
constant, the resumed run ends with the same weights as an uninterrupted one (on the same device).
A longer budget continues from a shorter one's checkpoints.

:func:`score` embeds the test split under every condition of the profile (and each transfer set:
MIMIC-CXR for CheXpert) with the *fine-tuned* network and scores the head through the grid unit's own
scoring (:meth:`crsrepro.run.grid._Unit._scored`: AUROC, ECE, classwise ECE, and at 100 % labels the four
recalibrators fitted on the seed's val split, temperature scaling among them), into tidy rows with
``regime="lora"``. :func:`lora_grid` runs cells x seeds x fractions into
``<output_dir>/lora/`` (a :class:`~crsrepro.run.results.ResultStore`), and :func:`compare` sets the
LoRA ranking against the frozen one (chapter 07).
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn

from crsrepro.core import __version__
from crsrepro.core.errors import CrsreproError
from crsrepro.core.io import atomic_write, content_key, git_hash
from crsrepro.profiles import Profile
from crsrepro.run.results import CACHE_VERSION, ResultStore
from crsrepro.core.vocab import CLEAN, LINEAR

log = logging.getLogger(__name__)

STAGE = "lora"
LORA_DROPOUT = 0.0  # [ours] no dropout on the adapters: the paper names none
DEFAULT_LR = 1e-3  # [ours] AdamW learning rate, constant (no schedule: a resumed run equals an uninterrupted one)
DEFAULT_WEIGHT_DECAY = 1e-2  # [ours] AdamW's default
DEFAULT_BATCH_SIZE = 32  # [ours] on the CPU; the GPU protocol uses 128 (benchmarks/lora.py)


@dataclass(frozen=True)
class LoraPlan:
    """What :func:`lora_grid` runs for a profile: the first ``n_seeds`` seeds, these label fractions,
    ``epochs`` per fine-tune, and the adaptable encoders left out (``exclude``)."""

    n_seeds: int
    fractions: tuple[float, ...]
    epochs: int
    exclude: tuple[str, ...] = ()


PLANS = {
    "paper": LoraPlan(n_seeds=3, fractions=(0.01, 0.05, 0.10, 0.25, 1.0), epochs=8),
    "demo": LoraPlan(n_seeds=1, fractions=(0.25, 1.0), epochs=2, exclude=("demo.effnet_lite0",)),
    "smoke": LoraPlan(n_seeds=2, fractions=(0.25, 1.0), epochs=1),
}
"""Per profile, the LoRA protocol. ``paper``: DESIGN.md section 11 (3 seeds, 8 epochs, full labels and
the 1/5/10/25 % fractions [ours: inferred]). ``demo`` [ours]: 1 seed (36 fine-tunes, about 20 minutes
of a 2-core CPU shared with the rest of the book; 2 seeds doubled it), 25 % and 100 % labels (the
fewest fractions that give a retention), 2 epochs, and the six TinyCNN / ViT networks without
EfficientNet-Lite0 (its LoRA step runs at ~37 img/s on one CPU thread against ~200 for the others,
``benchmarks/lora.py``, and its forward at 129 img/s against 1,180: it alone would take about half of
the demo's LoRA time), to fit the book's CPU budget. ``smoke``: 2 seeds, 1 epoch, every network.
A profile not named here uses the demo plan."""


class LoraError(CrsreproError, ValueError):
    """An encoder without declared LoRA targets, or a fraction or seed the profile does not have."""


def lora_targets(spec) -> list[str]:
    """The peft ``target_modules`` of an encoder: :data:`crsrepro.encoders.demo.LORA_TARGETS` for the demo
    networks.

    Raises
    ------
    LoraError
        No targets are declared for the encoder (the demo's classical extractors have no layers to adapt;
        the paper's encoders' targets are not declared yet).
    """
    from crsrepro.encoders.demo import LORA_TARGETS

    if spec.id not in LORA_TARGETS:
        raise LoraError(f"{spec.id}: no LoRA target modules are declared (crsrepro.encoders.demo.LORA_TARGETS "
                        f"covers {sorted(LORA_TARGETS)})")
    return list(LORA_TARGETS[spec.id])


def adaptable(encoders) -> list[str]:
    """The encoders among ``encoders`` that LoRA can adapt."""
    from crsrepro.encoders.demo import LORA_TARGETS

    return [e for e in encoders if e in LORA_TARGETS]


# --------------------------------------------------------------------------- the fine-tuned model

@dataclass
class FineTuned:
    """An encoder with trained adapters and its linear head; ``predict_proba`` of an embedding is the
    head's probabilities, so the grid unit scores it like a probe."""

    encoder: object  # the adapted copy of the encoder
    head: nn.Linear
    task: str
    epochs: int
    params: dict
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


def adapt(encoder, *, rank: int = 8, alpha: int = 16, seed: int = 0):
    """A copy of ``encoder`` with LoRA adapters injected (peft), its base frozen; the encoder is untouched.

    The adapters' initialisation is seeded by ``seed`` (peft: A random, B zero, so the adapted network
    starts equal to the base).
    """
    from peft import LoraConfig, inject_adapter_in_model

    adapted = copy.deepcopy(encoder)
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=LORA_DROPOUT, target_modules=lora_targets(encoder.spec),
                        bias="none")
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
        return encoder._forward_layers(x, ("final",))["final"].float()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        return encoder._forward_layers(x.contiguous(memory_format=torch.channels_last), ("final",))["final"].float()


def _load_images(spec, images: pd.DataFrame, conditions, canonical_size, batch_size: int = 64, num_workers: int = 0):
    """``uint8 [N, C, 3, S, S]``: every image under every condition, resized for ``spec`` (the feature
    extractor's own dataset, :class:`crsrepro.extract.features._ConditionedImages`)."""
    from torch.utils.data import DataLoader

    from crsrepro.extract.features import _ConditionedImages

    data = _ConditionedImages(images["image_id"].astype(str).tolist(), images["path"].astype(str).tolist(),
                              conditions=conditions, canonical_size=canonical_size, spec=spec)
    return torch.cat(list(DataLoader(data, batch_size=batch_size, num_workers=num_workers)))


def _n_outputs(view) -> int:
    return len(view.label_names)


def train(adapted, images: torch.Tensor, labels: np.ndarray, *, task: str, n_outputs: int, seed: int, epochs: int,
          lr: float = DEFAULT_LR, weight_decay: float = DEFAULT_WEIGHT_DECAY, batch_size: int = DEFAULT_BATCH_SIZE,
          accumulation_steps: int = 1, checkpoint_dir: Path | None = None, params: dict | None = None) -> FineTuned:
    """Train the adapters of ``adapted`` (from :func:`adapt`) and a linear head on ``images`` (uint8
    ``[N, 3, S, S]``), resuming from the last checkpoint in ``checkpoint_dir``.

    The head is initialised under ``seed``; epoch ``e`` visits the images in the order
    ``numpy.random.default_rng([seed, e]).permutation(N)``. With ``accumulation_steps > 1`` the
    gradients of that many batches are summed before a step (the GPU path's large effective batch).
    """
    device = adapted.device
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = nn.Linear(adapted.spec.embed_dim, n_outputs).to(device)
    trainable = [p for p in adapted.model.parameters() if p.requires_grad] + list(head.parameters())
    optimiser = torch.optim.AdamW(trainable, lr=lr, weight_decay=weight_decay)
    y_all = torch.as_tensor(labels, dtype=torch.long if task == "multiclass" else torch.float32)
    start = 0
    if checkpoint_dir is not None:
        done = sorted(int(p.stem.split("_")[1]) for p in Path(checkpoint_dir).glob("epoch_*.pt"))
        done = [e for e in done if e <= epochs]
        if done:
            start = done[-1]
            saved = torch.load(Path(checkpoint_dir) / f"epoch_{start}.pt", weights_only=True, map_location=device)
            adapted.model.load_state_dict(saved["adapters"], strict=False)
            head.load_state_dict(saved["head"])
            optimiser.load_state_dict(saved["optimizer"])
    started, seen = time.perf_counter(), 0
    for epoch in range(start, epochs):
        order = np.random.default_rng([seed, epoch]).permutation(len(images))
        batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
        optimiser.zero_grad(set_to_none=True)
        for step, idx in enumerate(batches, start=1):
            logits = head(_embed(adapted, images[idx]))
            (_loss(logits, y_all[idx].to(device), task) / accumulation_steps).backward()
            if step % accumulation_steps == 0 or step == len(batches):
                optimiser.step()
                optimiser.zero_grad(set_to_none=True)
            seen += len(idx)
        if checkpoint_dir is not None:
            state = {"epoch": epoch + 1, "adapters": _adapter_state(adapted.model), "head": head.state_dict(),
                     "optimizer": optimiser.state_dict()}
            atomic_write(Path(checkpoint_dir) / f"epoch_{epoch + 1}.pt", lambda f: torch.save(state, f))
    seconds = time.perf_counter() - started
    head.eval()
    return FineTuned(adapted, head, task, epochs, dict(params or {}), train_seconds=seconds,
                     images_per_second=seen / seconds if seen else np.nan, resumed_from=start)


# --------------------------------------------------------------------------- one fine-tune

def _hyper(rank, alpha, lr, weight_decay, batch_size, accumulation_steps, targets) -> dict:
    return dict(rank=rank, alpha=alpha, dropout=LORA_DROPOUT, lr=lr, weight_decay=weight_decay, batch_size=batch_size,
                accumulation_steps=accumulation_steps, target_modules=targets, optimiser="AdamW", schedule="constant")


def finetune(encoder_id: str, dataset: str, seed: int, *, rank: int = 8, alpha: int = 16, epochs: int = 8,
             label_fraction: float = 1.0, profile: Profile | str = "demo", lr: float = DEFAULT_LR,
             weight_decay: float = DEFAULT_WEIGHT_DECAY, batch_size: int = DEFAULT_BATCH_SIZE,
             accumulation_steps: int = 1, output_dir: Path | None = None, manifest_dir: Path | None = None,
             view=None, encoder=None, progress: bool = False) -> FineTuned:
    """Fine-tune ``encoder_id`` on ``dataset`` with LoRA for one seed and label fraction.

    Parameters
    ----------
    encoder_id, dataset : str
    seed : int
        One of the profile's seeds: its train split, label subsets, adapter and head initialisation.
    rank, alpha : int
        LoRA rank and scaling (the paper: 8 and 16).
    epochs : int
        The budget, the same for every encoder (the paper: 8; [ours] the demo plan uses fewer, :data:`PLANS`).
    label_fraction : float
        One of the profile's label fractions: the seed's label subset of the train split.
    profile : Profile or str
    lr, weight_decay, batch_size, accumulation_steps
        [ours] AdamW at a constant rate; see the module constants.
    output_dir : path, optional
        The results folder (default: the profile's); checkpoints go under ``lora/checkpoints/``.
    manifest_dir : path, optional
    view, encoder : optional
        A prepared dataset (:func:`crsrepro.run.grid._prepare`) and a built encoder, to reuse across calls.
    progress : bool

    Returns
    -------
    FineTuned
    """
    from crsrepro.data.manifests import label_subsets
    from crsrepro.encoders import create_encoder
    from crsrepro.run.grid import _as_profile, _labels_key, _prepare

    profile = _as_profile(profile)
    if seed not in profile.seeds or label_fraction not in profile.label_fractions:
        raise LoraError(f"profile {profile.name!r}: seed {seed} / label fraction {label_fraction} not among its "
                        f"seeds {profile.seeds} / fractions {profile.label_fractions}")
    view = view or _prepare(profile, dataset, manifest_dir, progress)
    encoder = encoder or create_encoder(encoder_id, device=profile.features.device)
    train_rows, _ = view.seed_rows[seed]
    split = view.pool.take(train_rows)
    subset = label_subsets(split.labels, fractions=profile.label_fractions, seed=seed, task=view.task)[label_fraction]
    params = _hyper(rank, alpha, lr, weight_decay, batch_size, accumulation_steps, lora_targets(encoder.spec))
    key = content_key(stage=f"{STAGE}-train", encoder=encoder_id, weights=encoder.weights_hash,
                      preprocessing=encoder.spec.preprocessing, images=view.images_key, seed=seed,
                      seed_split=view.seed_hash[seed], rows=content_key(rows=train_rows[subset].tolist()),
                      labels=_labels_key(split.labels[subset]), version=CACHE_VERSION, **params)
    images = _load_images(encoder.spec, split.images.iloc[subset], (CLEAN,), None)[:, 0]
    adapted = adapt(encoder, rank=rank, alpha=alpha, seed=seed)
    checkpoints = Path(output_dir or profile.output_path) / STAGE / "checkpoints" / key
    return train(adapted, images, split.labels[subset], task=view.task, n_outputs=_n_outputs(view), seed=seed,
                 epochs=epochs, lr=lr, weight_decay=weight_decay, batch_size=batch_size,
                 accumulation_steps=accumulation_steps, checkpoint_dir=checkpoints,
                 params={**params, "epochs": epochs, "label_fraction": label_fraction, "key": key})


def _embeddings(fine: FineTuned, requests: dict, val_rows: np.ndarray, batch_size: int) -> dict:
    """The grid's feats dict, from the fine-tuned network: test (every condition), transfers (clean), and
    of the pool only the val rows (what recalibration reads; the train rows stay NaN, unread)."""
    from crsrepro.extract.features import forward_batch

    out = {}
    for name, r in requests.items():
        images = r.images.iloc[val_rows] if name == "pool" else r.images
        stack = _load_images(fine.encoder.spec, images, r.conditions, r.canonical_size, batch_size)
        by_condition = {c: np.concatenate([forward_batch(fine.encoder, stack[i:i + batch_size, j], ("final",))["final"]
                                           .float().cpu().numpy() for i in range(0, len(stack), batch_size)])
                        for j, c in enumerate(r.conditions)}
        out[name] = by_condition if name == "test" else by_condition[CLEAN]
    pool = np.full((len(requests["pool"].images), out["pool"].shape[1]), np.nan, np.float32)
    pool[val_rows] = out["pool"]
    out["pool"] = pool
    return out


def score(fine: FineTuned, profile: Profile, view, seed: int, label_fraction: float) -> tuple[pd.DataFrame, dict]:
    """The fine-tuned model's tidy rows (``regime="lora"``) on every condition, and its per-case arrays."""
    from crsrepro.encoders import get_spec
    from crsrepro.run.grid import _feature_requests, _Unit

    unit = _Unit(profile, get_spec(fine.encoder.spec.id), view, seed, LINEAR)
    feats = _embeddings(fine, _feature_requests(profile, view), unit.val_rows, profile.features.batch_size)
    cases = {}
    rows = pd.DataFrame(unit._scored(label_fraction, fine, feats, cases)).assign(regime=STAGE)
    return rows, cases


# --------------------------------------------------------------------------- the LoRA grid

def default_cells(profile: Profile | str) -> list[tuple[str, str]]:
    """The (encoder, dataset) cells :func:`lora_grid` fine-tunes by default: the profile's cells of the
    LoRA-adaptable encoders (:func:`adaptable`) that its :data:`PLANS` entry does not exclude."""
    from crsrepro.run.grid import _as_profile
    from crsrepro.run.grid import cells as grid_cells

    profile = _as_profile(profile)
    plan = PLANS.get(profile.name, PLANS["demo"])
    encoders = [e for e in adaptable(profile.encoders) if e not in plan.exclude]
    log.info("lora: the cells of %s; left out: %s (not adaptable or excluded by the plan)",
             encoders, sorted(set(profile.encoders) - set(encoders)))
    return grid_cells(profile, encoders)


def lora_grid(profile: Profile | str, *, cells: list[tuple[str, str]] | None = None, seeds: list[int] | None = None,
              fractions: list[float] | None = None, epochs: int | None = None, output_dir: Path | None = None,
              manifest_dir: Path | None = None, progress: bool = False, merge: bool = True,
              **options) -> pd.DataFrame | None:
    """Fine-tune and score every (cell, seed, fraction) without a row-set yet; merge the tidy table.

    Defaults come from the profile's :data:`PLANS` entry; ``cells`` defaults to the profile's cells of
    the LoRA-adaptable encoders (:func:`adaptable`). ``options`` go to :func:`finetune` (rank, alpha, lr ...).
    The merged table is ``<output_dir>/lora/results.parquet``. ``merge=False`` only writes the row-sets
    and returns None: for tasks that run in parallel (the book's precompute step), which must not all
    rewrite one merged file while the others read it.
    """
    from crsrepro.run.grid import _as_profile, _case_arrays, _encoder, _view

    profile = _as_profile(profile)
    plan = PLANS.get(profile.name, PLANS["demo"])
    cells = default_cells(profile) if cells is None else cells
    seeds = list(seeds or profile.seeds[:plan.n_seeds])
    fractions = list(fractions or [f for f in plan.fractions if f in profile.label_fractions])
    epochs = epochs or plan.epochs
    root = Path(output_dir or profile.output_path)
    store = ResultStore(root / STAGE)
    provenance = {"crsrepro": __version__, "git": git_hash()}
    keys = []
    for encoder_id, dataset in cells:
        view = _view(profile, dataset, manifest_dir)
        encoder = _encoder(encoder_id, None, profile.features.device)
        for seed in seeds:
            for fraction in fractions:
                key = _rowset_key(profile, encoder, view, seed, fraction, epochs, options)
                keys.append(key)
                if store.has(key):
                    continue
                fine = finetune(encoder_id, dataset, seed, epochs=epochs, label_fraction=fraction, profile=profile,
                                output_dir=root, view=view, encoder=encoder, progress=progress, **options)
                rows, cases = score(fine, profile, view, seed, fraction)
                rows["rowset"] = key
                rows.attrs = {**provenance, "key": key, "train_key": fine.params["key"],
                              "images_per_second": fine.images_per_second}
                if cases:
                    store.write_cases(key, _case_arrays(view, cases))
                store.write(key, rows)
                log.info("lora: %s %s seed %d fraction %s: %.1f img/s", encoder_id, dataset, seed, fraction,
                         fine.images_per_second)
    if not merge:
        return None
    return store.merge(keys, attrs={"profile": profile.name, "profile_fingerprint": profile.fingerprint(),
                                    "epochs": epochs})


def _rowset_key(profile, encoder, view, seed, fraction, epochs, options) -> str:
    """The LoRA row-set key: the frozen grid unit's key (every feature, split, label and probe input) and
    the fine-tune's parameters."""
    from crsrepro.encoders import get_spec
    from crsrepro.run.grid import _feature_keys, _feature_requests, _Unit

    unit = _Unit(profile, get_spec(encoder.spec.id), view, seed, LINEAR)
    hyper = _hyper(options.get("rank", 8), options.get("alpha", 16), options.get("lr", DEFAULT_LR),
                   options.get("weight_decay", DEFAULT_WEIGHT_DECAY), options.get("batch_size", DEFAULT_BATCH_SIZE),
                   options.get("accumulation_steps", 1), lora_targets(encoder.spec))
    return content_key(stage=STAGE, unit=unit.key(_feature_keys(encoder, _feature_requests(profile, view))),
                       fraction=fraction, epochs=epochs, **hyper)


# --------------------------------------------------------------------------- analyses

def lora_profiles(results: pd.DataFrame) -> pd.DataFrame:
    """The four dimensions of every LoRA (encoder, dataset, seed), read as the primary runs are."""
    from crsrepro.score.dimensions import reliability_profiles
    from crsrepro.run.results import runs_table

    runs = runs_table(results)
    return reliability_profiles(runs[runs["regime"] == STAGE].assign(regime="frozen"))


@dataclass(frozen=True)
class LoraComparison:
    """Frozen vs LoRA (chapter 07).

    Attributes
    ----------
    per_domain : DataFrame
        Per dataset: ``n_encoders``, ``kendall_tau`` of the AUROC rankings, ``reversed_pairs``,
        ``leader_frozen``, ``leader_lora``, ``leader_changed``, ``auroc_gain`` (mean LoRA - frozen).
    crs : RankAgreement
        The four-dimensional comparison: the encoders' mean CRS, frozen (``a``) vs LoRA (``b``); its
        ``ranks`` feed :func:`crsrepro.present.plots.rank_shift` (``a="frozen", b="LoRA"``).
    movers : DataFrame
        ``crs.ranks`` sorted by the size of the shift (who moves most).
    top3_hold : bool
        Whether the top three by CRS are the same encoders.
    """

    per_domain: pd.DataFrame
    crs: object
    movers: pd.DataFrame
    top3_hold: bool


def compare(frozen: pd.DataFrame, lora: pd.DataFrame, frame=None) -> LoraComparison:
    """Compare the frozen and LoRA reliability profiles on the cells and seeds both have.

    Parameters
    ----------
    frozen, lora : DataFrame
        Per-seed reliability-profiles tables (:func:`crsrepro.score.dimensions.reliability_profiles`, :func:`lora_profiles`).
    frame : ReferenceFrame, optional
        Score both with the frozen frame (the paper's CRS); default [ours] ``mode="cohort"`` over the
        compared encoders, since the LoRA panel may be smaller than the frame's.
    """
    from crsrepro.score.crs import aggregate_crs, crs_scores
    from crsrepro.score.stats import rank_agreement

    on = ["encoder", "dataset", "seed"]
    common = frozen[on].merge(lora[on])
    if common.empty:
        raise LoraError("frozen and LoRA profiles share no (encoder, dataset, seed)")
    frozen, lora = frozen.merge(common), lora.merge(common)
    rows = []
    for dataset in dict.fromkeys(common["dataset"]):
        a = frozen[frozen["dataset"] == dataset].groupby("encoder")["auroc"].mean()
        b = lora[lora["dataset"] == dataset].groupby("encoder")["auroc"].mean()
        agreement = rank_agreement(a.to_dict(), b.to_dict()) if len(a) > 1 else None
        rows.append({"dataset": dataset, "n_encoders": len(a),
                     "kendall_tau": agreement.kendall_tau if agreement else np.nan,
                     "reversed_pairs": agreement.reversed_pairs if agreement else 0,
                     "leader_frozen": a.idxmax(), "leader_lora": b.idxmax(), "leader_changed": a.idxmax() != b.idxmax(),
                     "auroc_gain": float((b - a).mean())})
    mode = "cohort" if frame is None else "fixed"
    columns = on + ["auroc", "ece", "retention", "robustness"]
    crs_a = aggregate_crs(crs_scores(frozen[columns], frame, mode=mode))["crs"]
    crs_b = aggregate_crs(crs_scores(lora[columns], frame, mode=mode))["crs"]
    crs = rank_agreement(crs_a.to_dict(), crs_b.to_dict())
    movers = crs.ranks.assign(abs_shift=crs.ranks["shift"].abs()).sort_values("abs_shift", ascending=False, kind="stable")
    return LoraComparison(pd.DataFrame(rows), crs, movers.drop(columns="abs_shift"), crs.top3_overlap == 1.0)


def paper_gpu_hours(images_per_second: float | None = None, *, n_seeds: int = 3, epochs: int = 8,
                    fractions=(0.01, 0.05, 0.10, 0.25, 1.0)) -> float:
    """GPU-hours of the paper's LoRA protocol: its 43 cells x ``n_seeds`` seeds x the label regimes x
    ``epochs`` epochs, each epoch one pass over the cell's labelled train images (the planner's counts:
    :data:`crsrepro.run.plan.DATASET_IMAGES` x the train share), at ``images_per_second``.

    The default rate is the planner's ``gpu_lora_vit_b16`` (:data:`crsrepro.run.plan.THROUGHPUTS`): about
    3,100 img/s for a ViT-B/16 LoRA step in bf16 at batch 128 on one H200, the figure quoted in issue 13
    (not measured by this package; ``benchmarks/lora.py`` measures it on a GPU). Every encoder is costed
    at that one rate; ``crsrepro plan --profile paper`` scales it per encoder.

    >>> round(paper_gpu_hours(), 1)
    7.0
    """
    from crsrepro.run.grid import cells
    from crsrepro.run.plan import DATASET_IMAGES, SPLIT_SHARES, THROUGHPUTS

    rate = images_per_second or THROUGHPUTS["gpu_lora_vit_b16"].value
    per_epoch = sum(DATASET_IMAGES[dataset][0] * SPLIT_SHARES["train"] for _, dataset in cells("paper"))
    return per_epoch * sum(fractions) * n_seeds * epochs / rate / 3600


__all__ = ["LoraComparison", "LoraError", "LoraPlan", "PLANS", "adapt", "adaptable", "base_state", "compare",
           "finetune", "lora_grid", "lora_profiles", "lora_targets", "paper_gpu_hours", "score", "train"]
