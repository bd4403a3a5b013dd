"""The compute planner: what a profile's run costs, counted before any data exists (DESIGN.md section 13).

``crsrepro plan --profile P`` counts, from the profile and the encoder registry only,

- the images per dataset and split (the fixed test split is 20 % of a dataset, each seed's train / val
  70 / 10 % of it, DESIGN.md section 3; a transfer set is scored whole);
- the forward passes per encoder and condition: the clean non-test pool once, the test split under
  every condition (clean + perturbations), each transfer set once. The depth taps come from the same
  pass (:mod:`crsrepro.encoders.registry`), so they add no forward pass;
- the probe fits (linear: cells x seeds x label fractions; the control probes likewise at their
  fractions; the recalibrators: cells x seeds x 4), the runs they score (the grid's
  :func:`~crsrepro.run.grid.enumerate_runs`: 17,575 for ``paper``), the LoRA steps (DESIGN.md section 11)
  and the bootstrap replicates (section 10);

and, with the throughputs of :data:`THROUGHPUTS` (each with its source), the GPU-hours, CPU-hours and
feature-cache disk (N x D x 4 bytes per float32 array) per stage, per encoder and in total.

The cost model is [ours], stated here once:

- An encoder's forward (and LoRA) rate is the reference ViT-B/16 rate scaled by
  ``(224 / input_size)**2 * (86M / n_params)``: cost grows with the pixels (tokens) and the
  parameters. It ignores attention's quadratic term, so it *under*-states the large-input encoders
  (MedGemma at 896 px, RAD-DINO at 518 px). Encoders without ``n_params`` (the demo panel) use the
  CPU rates measured by ``benchmarks/demo_encoders.py``.
- A linear-probe fit (all C values at one label fraction) costs ``n_train x D x n_outputs x n_C``
  times a constant measured by ``benchmarks/probes.py`` (torch L-BFGS, 1 thread, CPU). The control
  probes are costed like the linear probe (not measured); recalibrators and scoring are counted but
  cost next to nothing.
- LoRA is priced on the cells the LoRA stage fine-tunes (:func:`crsrepro.run.lora.default_cells`: the
  encoders with declared LoRA targets, less the plan's ``lora.exclude``; for ``paper`` all 43), for the
  profile's ``lora`` plan (its seeds and label fractions, as :class:`crsrepro.run.lora.LoraStage` runs
  them), under the fixed step budget (every fraction trains for ``lora.epochs`` passes over the full
  train split, :meth:`crsrepro.run.lora.LoraParams.budget`) at the GPU batch of :data:`LORA`. It trains at
  the LoRA/forward rate ratio of ViT-B/16 times the encoder's forward rate, on a GPU for the paper's
  encoders and on the CPU for the demo's networks; each fine-tuned model is then scored on val, the test
  split under every condition and the transfer sets (forward passes at the encoder's forward rate).
- A dataset's image count is ``demo_world.n_images`` for a demo-world profile, else ``data.subsample``
  where set, else the release's count in :data:`DATASET_IMAGES`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from crsrepro.core.errors import CrsreproError
from crsrepro.profiles import Profile, as_profile, load_profile
from crsrepro.core.vocab import RECALIBRATORS

#: Images per dataset as used by the paper's protocol (frontal views for CheXpert and MIMIC-CXR), with
#: the source of each count. Used for profiles that read real data (``data.source: local``).
DATASET_IMAGES: dict[str, tuple[int, str]] = {
    "isic2019": (25_331, "ISIC 2019 training set (DESIGN.md section 3; ../shared/realdata README)"),
    "aptos2019": (3_662, "APTOS 2019 train.csv (DESIGN.md section 3)"),
    "chexpert": (191_229, "CheXpert v1.0 frontal train + valid, 191,027 + 202 (DESIGN.md section 3)"),
    "mimic_cxr": (3_330, "ESTIMATE [ours]: MIMIC-CXR-JPG 2.0.0 official test split, 5,159 images, times "
                         "the release's frontal (AP + PA) share of about 0.645; the exact frontal count is "
                         "not documented here"),
    "isic2017": (2_750, "ISIC 2017 Part 3, 2,000 train + 150 val + 600 test (../shared/realdata README)"),
    "kermany_cxr": (5_840, "Kermany CXR, train 5,216 + test 624 (../shared/realdata README)"),
    "nih_cxr14": (112_120, "NIH ChestX-ray14 Data_Entry_2017_v2020.csv rows (../shared/realdata README)"),
}

#: The split of a dataset (DESIGN.md section 3): the fixed test split and each seed's train / val.
SPLIT_SHARES = {"train": 0.70, "val": 0.10, "test": 0.20}
#: The LoRA batch the planner prices (the GPU protocol's, ``benchmarks/lora.py``); the seeds, fractions and
#: epochs are the profile's ``lora`` plan.
LORA = {"batch_size": 128}


@dataclass(frozen=True)
class Throughput:
    """A documented rate and where it comes from (measured: which benchmark, on which machine)."""

    value: float
    unit: str
    source: str


#: Every rate the planner uses. Edit a value here (with its source) when a new measurement exists.
THROUGHPUTS: dict[str, Throughput] = {
    "gpu_forward_vit_b16": Throughput(10_900, "img/s", "ViT-B/16 pure compiled bf16 forward, one H200, batch 512 "
                                      "(a 30-minute prototype run outside this repository; not yet in benchmarks/)"),
    "gpu_lora_vit_b16": Throughput(3_100, "img/s", "ViT-B/16 LoRA training step, bf16, batch 128, one H200 (measured outside this repository; not yet in benchmarks/)"),
    "cpu_linear_probe": Throughput(191 / (42_750 * 768 * 14 * 7), "s per (n x D x output x C)",
                                   "benchmarks/probes.py --threads 1, CheXpert x0.25 (42,750 x 768, 14 labels x 7 C) "
                                   "in 191 s, torch L-BFGS, the project's 2-core CPU VM (README Speed)"),
    "cpu_recalibrator": Throughput(0.05, "s per fit", "[ours] an allowance, not measured (a few parameters on "
                                   "the val split)"),
    "cpu_seed_bootstrap": Throughput(10_000 / 0.39, "replicates/s", "benchmarks/bootstrap.py, 10,000 seed-paired "
                                     "replicates of 15 x 3 x 5 in 0.39 s, 2-core CPU VM (README Speed)"),
    "cpu_case_bootstrap": Throughput(1_000 * 15 * 2_000 * 14 / 9.9, "replicate x encoder x case x label / s",
                                     "benchmarks/bootstrap.py, 1,000 replicates x 15 encoders x 2,000 cases x 14 "
                                     "labels in 9.9 s, 2-core CPU VM (README Speed)"),
}
#: Demo encoders' forward rates on one CPU thread, batch 64 (benchmarks/demo_encoders.py, the 2-core VM;
#: README Speed; the TinyCNNs at the low end of their 1,180-1,400 range).
CPU_FORWARD: dict[str, float] = {
    "demo.effnet_lite0": 129, "demo.random_vit": 437, "demo.texture": 449, "demo.color_histogram": 3_950,
    "demo.pixel_pca": 170_000, "demo.random_cnn": 1_180, "demo.derm_cnn": 1_180, "demo.fundus_cnn": 1_180,
    "demo.cxr_cnn": 1_180, "demo.med_cnn": 1_180,
}
REFERENCE = {"input_size": 224, "n_params": 85_798_656}  # general.vit_b16, the encoder the GPU rates are for


@dataclass
class Plan:
    """A profile's counts and costs. Every table is a DataFrame; :meth:`to_text` prints them.

    Attributes
    ----------
    profile : str
    images : DataFrame
        Per dataset: ``total``, ``train``, ``val``, ``test`` (per seed), ``role`` and the count's source.
    forward : DataFrame
        Per (encoder, dataset, condition): ``images`` (forward passes), ``dim``, ``disk_bytes``.
    encoders : DataFrame
        Per encoder: forward passes, rate, ``gpu_hours``/``cpu_hours`` of extraction and LoRA, disk.
    stages : DataFrame
        Per stage: ``count`` (what is counted, ``unit``), ``gpu_hours``, ``cpu_hours``, ``disk_gb``; a
        ``total`` row last.
    n_runs : int
        The linear-probe grid's runs (equals ``len(crsrepro.run.grid.enumerate_runs(profile))``).
    """

    profile: str
    images: pd.DataFrame
    forward: pd.DataFrame
    encoders: pd.DataFrame
    stages: pd.DataFrame
    n_runs: int

    def to_text(self) -> str:
        """The plan as plain text: the stages and totals, then the per-encoder and per-dataset tables."""
        rates = "\n".join(f"  {name}: {t.value:,.4g} {t.unit} ({t.source})" for name, t in THROUGHPUTS.items())
        fmt = {"gpu_hours": "{:,.2f}".format, "cpu_hours": "{:,.2f}".format, "disk_gb": "{:,.2f}".format,
               "lora_gpu_hours": "{:,.2f}".format, "forward_gpu_hours": "{:,.2f}".format,
               "lora_cpu_hours": "{:,.2f}".format, "forward_cpu_hours": "{:,.2f}".format,
               "rate_img_s": "{:,.0f}".format}
        return "\n\n".join([
            f"compute plan for profile {self.profile!r}: {self.n_runs:,} runs of the linear-probe grid",
            "per stage\n" + self.stages.to_string(index=False, formatters=fmt),
            "per encoder (extraction + LoRA)\n" + self.encoders.to_string(index=False, formatters=fmt),
            "images per dataset (train / val per seed, test fixed)\n"
            + self.images.drop(columns="source").to_string(index=False) + "\n"
            + "\n".join(f"  {r.dataset}: {r.source}" for r in self.images.itertuples()),
            "throughputs\n" + rates,
            "not counted: the depth taps' extra cache arrays (the profile does not name the depth-sweep pairs; "
            "their forward passes are the final layer's) and the images' own disk",
        ])


def _dataset_images(profile: Profile, dataset: str) -> tuple[int, str]:
    if profile.data.source == "demo_world":
        counts = profile.demo_world.n_images
        if dataset not in counts:
            raise CrsreproError(f"profile {profile.name!r} ({profile.source}): key demo_world.n_images has no "
                                f"count for {dataset}")
        return counts[dataset], "demo_world.n_images"
    if dataset in profile.data.subsample:
        return profile.data.subsample[dataset], "data.subsample"
    count, source = DATASET_IMAGES[dataset]
    if profile.data.images == "present-only":  # a partial download is read as it is
        source += "; an upper bound, since data.images is present-only"
    return count, source


def _forward_rate(spec, device: str) -> tuple[float, bool]:
    """``(img/s, on a GPU)`` of one encoder's forward pass (the module docstring's cost model)."""
    if spec.n_params is None:
        if spec.id not in CPU_FORWARD:
            raise CrsreproError(f"encoder {spec.id}: no n_params in its spec and no measured rate in "
                                f"crsrepro.run.plan.CPU_FORWARD; the planner cannot cost it")
        return CPU_FORWARD[spec.id], False
    scale = (REFERENCE["input_size"] / spec.input_size) ** 2 * REFERENCE["n_params"] / spec.n_params
    return THROUGHPUTS["gpu_forward_vit_b16"].value * scale, device != "cpu"


def plan(profile: Profile | str) -> Plan:
    """Count and cost a profile's run (see the module docstring for what is counted and the cost model).

    >>> p = plan("paper")
    >>> p.n_runs
    17575
    >>> p.encoders.iloc[0]["encoder"]  # the most expensive encoder comes first
    'medical.medgemma'
    """
    from crsrepro.data import get_dataset_spec
    from crsrepro.encoders import get_encoder_spec
    from crsrepro.run.grid import cells
    from crsrepro.run.lora import default_cells
    from crsrepro.run.views import conditions_for

    profile = as_profile(profile)
    images = []
    for dataset in profile.all_datasets():
        total, source = _dataset_images(profile, dataset)
        trainable = dataset in profile.datasets
        split = ({k: round(total * share) for k, share in SPLIT_SHARES.items()} if trainable
                 else {"train": 0, "val": 0, "test": total})
        images.append({"dataset": dataset, "role": "train/test" if trainable else "transfer", "total": total,
                       **split, "n_outputs": len(get_dataset_spec(dataset).label_names), "source": source})
    images = pd.DataFrame(images).set_index("dataset", drop=False)

    the_cells = cells(profile)
    forward = []
    for encoder, dataset in the_cells:
        spec, row = get_encoder_spec(encoder), images.loc[dataset]
        arrays = [(dataset, "clean (pool)", row.train + row.val)] + [(dataset, c, row.test)
                                                                for c in profile.conditions(dataset)]
        arrays += [(t, "clean (transfer)", images.loc[t].total) for t in profile.transfer_targets(dataset)]
        forward += [{"encoder": encoder, "dataset": d, "condition": c, "images": int(n), "dim": spec.embed_dim,
                     "disk_bytes": int(n) * spec.embed_dim * 4} for d, c, n in arrays]
    forward = pd.DataFrame(forward)

    fractions = list(profile.label_fractions)
    control_fractions = list(profile.control_probes.label_fractions or fractions)
    n_seeds, n_c = len(profile.seeds), len(profile.probe.c_grid)
    probe_unit = THROUGHPUTS["cpu_linear_probe"].value
    linear_s = control_s = 0.0
    lora_images_by_encoder, lora_scored_by_encoder = {}, {}
    lora_cells = set(default_cells(profile))
    lora_seeds = len(profile.seeds[:profile.lora.n_seeds])
    lora_fractions = [f for f in profile.lora.label_fractions if f in profile.label_fractions]
    n_runs = 0
    for encoder, dataset in the_cells:
        spec, row = get_encoder_spec(encoder), images.loc[dataset]
        def per_fit(fraction):  # seconds of one fit (every C value) on the fraction's labelled train images
            return probe_unit * max(1, round(row.train * fraction)) * spec.embed_dim * row.n_outputs * n_c

        linear_s += n_seeds * sum(per_fit(f) for f in fractions)
        control_s += n_seeds * len(profile.control_probes.probes) * sum(per_fit(f) for f in control_fractions)
        n_runs += n_seeds * len(fractions) * len(conditions_for(profile, dataset))
        fine_tunes = lora_seeds * len(lora_fractions) * ((encoder, dataset) in lora_cells)
        # the fixed step budget: every fraction trains lora.epochs passes' worth of the full train split
        seen = fine_tunes * profile.lora.epochs * math.ceil(row.train / LORA["batch_size"]) * LORA["batch_size"]
        scored = fine_tunes * (row.test * len(profile.conditions(dataset)) + row.val
                               + sum(images.loc[t].total for t in profile.transfer_targets(dataset)))
        lora_images_by_encoder[encoder] = lora_images_by_encoder.get(encoder, 0) + seen
        lora_scored_by_encoder[encoder] = lora_scored_by_encoder.get(encoder, 0) + scored

    per_encoder = []
    for encoder in dict.fromkeys(e for e, _ in the_cells):
        spec = get_encoder_spec(encoder)
        rate, on_gpu = _forward_rate(spec, profile.features.device)
        passes = int(forward.loc[forward.encoder == encoder, "images"].sum())
        lora_rate = rate * THROUGHPUTS["gpu_lora_vit_b16"].value / THROUGHPUTS["gpu_forward_vit_b16"].value
        lora_h = (lora_images_by_encoder[encoder] / lora_rate + lora_scored_by_encoder[encoder] / rate) / 3600
        per_encoder.append({"encoder": encoder, "input_size": spec.input_size, "n_params": spec.n_params,
                            "forward_passes": passes, "rate_img_s": rate, "on_gpu": on_gpu,
                            "forward_gpu_hours": passes / rate / 3600 if on_gpu else 0.0,
                            "forward_cpu_hours": 0.0 if on_gpu else passes / rate / 3600,
                            "lora_steps": math.ceil(lora_images_by_encoder[encoder] / LORA["batch_size"]),
                            "lora_gpu_hours": lora_h if on_gpu else 0.0, "lora_cpu_hours": 0.0 if on_gpu else lora_h,
                            "disk_gb": forward.loc[forward.encoder == encoder, "disk_bytes"].sum() / 1e9})
    per_encoder = (pd.DataFrame(per_encoder).sort_values(["forward_gpu_hours", "forward_cpu_hours"], ascending=False, kind="stable")
                   .reset_index(drop=True))

    n_recal = len(the_cells) * n_seeds * len(RECALIBRATORS)
    test_cases = sum(images.loc[d].test for d in profile.datasets)
    n_encoders = len(profile.encoders)
    case_work = profile.bootstrap.n_case_resamples * n_encoders * sum(
        images.loc[d].test * images.loc[d].n_outputs for d in profile.datasets)
    bootstrap_s = (profile.bootstrap.n_resamples / THROUGHPUTS["cpu_seed_bootstrap"].value
                   + case_work / THROUGHPUTS["cpu_case_bootstrap"].value)
    n_linear = len(the_cells) * n_seeds * len(fractions)
    n_control = len(the_cells) * n_seeds * len(control_fractions) * len(profile.control_probes.probes)
    stages = pd.DataFrame([
        ("feature extraction", int(forward["images"].sum()), "forward passes",
         per_encoder.forward_gpu_hours.sum(), per_encoder.forward_cpu_hours.sum(), forward.disk_bytes.sum() / 1e9),
        ("linear probes", n_linear, "fits", 0.0, linear_s / 3600, 0.0),
        ("control probes", n_control, "fits", 0.0, control_s / 3600, 0.0),
        ("recalibrators", n_recal, "fits", 0.0, n_recal * THROUGHPUTS["cpu_recalibrator"].value / 3600, 0.0),
        ("scoring", n_runs, "linear-probe runs", 0.0, 0.0, 0.0),
        ("LoRA fine-tuning", int(per_encoder.lora_steps.sum()), f"steps of {LORA['batch_size']}",
         per_encoder.lora_gpu_hours.sum(), per_encoder.lora_cpu_hours.sum(), 0.0),
        ("bootstrap", profile.bootstrap.n_resamples + profile.bootstrap.n_case_resamples * len(profile.datasets),
         f"replicates ({test_cases:,} test cases)", 0.0, bootstrap_s / 3600, 0.0),
    ], columns=["stage", "count", "unit", "gpu_hours", "cpu_hours", "disk_gb"])
    total = pd.DataFrame([{"stage": "total", "count": pd.NA, "unit": "", **stages[["gpu_hours", "cpu_hours", "disk_gb"]].sum()}])
    stages = pd.concat([stages, total], ignore_index=True)
    return Plan(profile.name, images.reset_index(drop=True), forward, per_encoder, stages, n_runs)


def paper_gpu_hours(images_per_second: float | None = None, *, n_seeds: int | None = None, epochs: int | None = None,
                    fractions=None) -> float:
    """GPU-hours of the paper's LoRA protocol: its LoRA cells (:func:`crsrepro.run.lora.default_cells`, all
    43) x ``n_seeds`` seeds x the label regimes x ``epochs`` epochs (default: the ``paper`` profile's
    ``lora`` plan). Under the fixed step budget (:meth:`crsrepro.run.lora.LoraParams.budget`) every label
    regime trains for ``epochs`` passes' worth of the cell's *full* train split (:data:`DATASET_IMAGES` x
    the train share), at ``images_per_second``.

    The default rate is the planner's ``gpu_lora_vit_b16`` (:data:`THROUGHPUTS`): about
    3,100 img/s for a ViT-B/16 LoRA step in bf16 at batch 128 on one H200 (not measured by this package;
    ``benchmarks/lora.py`` measures it on a GPU). Every encoder is costed at that one rate;
    ``crsrepro plan --profile paper`` scales it per encoder.

    >>> round(paper_gpu_hours(), 1)
    24.8
    """
    from crsrepro.run.lora import default_cells

    paper = load_profile("paper")
    n_seeds, epochs = n_seeds or paper.lora.n_seeds, epochs or paper.lora.epochs
    fractions = paper.lora.label_fractions if fractions is None else fractions
    rate = images_per_second or THROUGHPUTS["gpu_lora_vit_b16"].value
    per_epoch = sum(DATASET_IMAGES[dataset][0] * SPLIT_SHARES["train"] for _, dataset in default_cells(paper))
    return per_epoch * len(fractions) * n_seeds * epochs / rate / 3600


__all__ = ["CPU_FORWARD", "DATASET_IMAGES", "LORA", "Plan", "SPLIT_SHARES", "THROUGHPUTS", "Throughput", "paper_gpu_hours",
           "plan"]
