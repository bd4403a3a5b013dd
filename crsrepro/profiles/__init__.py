"""Profiles: one YAML file names everything a run depends on (DESIGN.md section 2).

A profile names the datasets, the encoders, the seeds, the label fractions, the perturbations, the
probe budget, the bootstrap size and the output folders, and what differs between profiles beyond the
grid: the depth-sweep pairs, the LoRA plan, the name the split manifests carry, whether the claims page
compares with the paper, and the book's coverage run. Behaviour is read from these keys, never from a
profile's name, so a copy of ``paper.yaml`` under another name runs the paper's protocol. Profiles ship as
``crsrepro/profiles/{demo,smoke,paper,real-mini}.yaml``; a profile may ``include`` another and override
keys. :func:`load_profile` is the only way to read one: it validates every key once (an unknown key, a
missing one or a bad value raises :class:`~crsrepro.core.errors.ProfileError` naming the file and the key),
fills in the documented defaults of the optional keys (:data:`DEFAULTS`), and returns a frozen
:class:`Profile` whose sections are frozen dataclasses, so editors and readers see every attribute.

(The word: a *profile* here is a run configuration, as in ``crsrepro run --profile demo``. The paper's
four-dimensional *reliability profile* of an encoder on a dataset is always called that in full; see
:mod:`crsrepro.score.dimensions`.)

A profile owns its outputs: its ``name`` and ``output_dir`` are never inherited through ``include``.
``name`` defaults to the profile's own file name and ``output_dir`` to ``${CRSREPRO_HOME}/<name>/results``,
so ``include: smoke`` plus a narrowing writes its merged table, its split manifests and its frame under
its own name and never replaces smoke's. Repeated seeds, encoders or datasets, and seeds outside numpy's
range 0..2**32-1, are errors; :func:`check_devices` (called by every command that computes) refuses a
cuda device on a machine without one.

Paths in a profile may use ``${VAR}`` environment variables. ``${CRSREPRO_HOME}`` defaults to
``./.crsrepro``, and the shipped profiles put everything they write under it (generated data, caches and
results), so ``CRSREPRO_HOME=X`` puts all of it in ``X``. A relative path resolves against the folder of
the profile file that is loaded, so it means the same from any working directory. A variable without a
value is an error only when that path is used.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from crsrepro.core.errors import ProfileError
from crsrepro.core.schema import condition_name
from crsrepro.core.vocab import (CLEAN, CONTROL_PROBES, DATASET_IDS, EXTRA_PERTURBATIONS, IMAGE_POLICIES, PERTURBATIONS,
                                 PROBE_BACKENDS, SEVERITIES, U_POLICIES)

PROFILE_DIR = Path(__file__).parent
DATA_SOURCES = ("demo_world", "local")
C_SELECTIONS = ("nested_val", "full_val")
SEED_MAX = 2**32 - 1  #: numpy's largest seed: every profile seed seeds a numpy generator
UNIQUE_KEYS = ("datasets", "encoders", "seeds")  #: lists whose repeats would duplicate result rows


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_encoder_id(v):
    return isinstance(v, str) and "." in v


def _choice(options):
    def check(v):
        return v in options, f"one of {', '.join(map(str, options))}"
    return check


def _list_of(check_item, what, *, nonempty=True):
    def check(v):
        ok = isinstance(v, list) and (len(v) > 0 or not nonempty) and all(check_item(x) for x in v)
        return ok, f"a {'non-empty ' if nonempty else ''}list of {what}"
    return check


def _scalar(pred, what):
    def check(v):
        return pred(v), what
    return check


_str = _scalar(lambda v: isinstance(v, str) and v != "", "a non-empty string")
_pos_int = _scalar(lambda v: _is_int(v) and v > 0, "a positive integer")
_nonneg_int = _scalar(lambda v: _is_int(v) and v >= 0, "a non-negative integer")
_pos_number = _scalar(lambda v: _is_number(v) and v > 0, "a positive number")
_optional_pos_int = _scalar(lambda v: v is None or (_is_int(v) and v > 0), "a positive integer or null")
_fraction_list = _list_of(lambda x: _is_number(x) and 0 < x <= 1, "fractions in (0, 1]")
_dataset_counts = _scalar(
    lambda v: isinstance(v, dict) and set(v) <= set(DATASET_IDS) and all(_is_int(n) and n > 0 for n in v.values()),
    f"a mapping from dataset ids ({', '.join(DATASET_IDS)}) to positive integers",
)

_transfer = _scalar(
    lambda v: isinstance(v, dict) and all(
        k in DATASET_IDS and (t in DATASET_IDS if isinstance(t, str) else
                              isinstance(t, list) and len(t) > 0 and all(x in DATASET_IDS for x in t))
        for k, t in v.items()),
    "a mapping from a training dataset id to a transfer dataset id or a list of them",
)
_TRAINABLE = tuple(d for d in DATASET_IDS if d != "mimic_cxr")
_pairs = _scalar(lambda v: isinstance(v, list) and len(v) > 0 and all(
    isinstance(p, list) and len(p) == 2 and _is_encoder_id(p[0]) and p[1] in _TRAINABLE for p in v),
    f"a non-empty list of [encoder id, dataset id] pairs (datasets among {', '.join(_TRAINABLE)}) or null")

# The schema: a nested dict whose leaves are checks. Every key a profile may hold is listed here.
SCHEMA: dict[str, Any] = {
    "name": _scalar(lambda v: isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", v) is not None,
                    "a name of letters, digits, '.', '_' and '-' (it names the profile's folders)"),
    "description": _scalar(lambda v: isinstance(v, str), "a string"),
    "data": {
        "source": _choice(DATA_SOURCES),
        "root": _str,
        "u_policy": _choice(U_POLICIES),
        "split_seed": _nonneg_int,
        "split_fractions": _scalar(lambda v: isinstance(v, list) and len(v) == 3 and all(_is_number(x) and x > 0 for x in v)
                                   and abs(sum(v) - 1) < 1e-9, "three positive shares [train, val, test] summing to 1"),
        "images": _choice(IMAGE_POLICIES),
        "folders": _scalar(lambda v: isinstance(v, dict) and set(v) <= set(DATASET_IDS)
                           and all(isinstance(f, str) and f for f in v.values()),
                           "a mapping from dataset ids to folder names"),
        "subsample": _scalar(lambda v: isinstance(v, dict) and set(v) <= set(DATASET_IDS)
                             and all(_is_int(n) and n > 0 for n in v.values()),
                             "a mapping from dataset ids to positive image counts"),
    },
    "demo_world": {"seed": _nonneg_int, "image_size": _pos_int, "n_images": _dataset_counts},
    "datasets": _list_of(lambda x: x in _TRAINABLE, f"ids among {', '.join(_TRAINABLE)}"),
    "transfer": _transfer,
    "robustness_transfer": _list_of(lambda x: x in DATASET_IDS, "transfer dataset ids", nonempty=False),
    "encoders": _list_of(_is_encoder_id, "encoder ids (namespace.name)"),
    "seeds": _list_of(lambda x: _is_int(x) and x >= 0, "non-negative integers"),  # and <= SEED_MAX
    "label_fractions": _fraction_list,
    "perturbations": _list_of(lambda x: x in PERTURBATIONS, f"perturbations among {', '.join(PERTURBATIONS)}", nonempty=False),
    "severities": _list_of(lambda x: x in SEVERITIES, f"severities among {', '.join(map(str, SEVERITIES))}",
                           nonempty=False),
    "noise_model": _scalar(lambda v: isinstance(v, dict) and set(v) <= set(DATASET_IDS)
                           and all(m in EXTRA_PERTURBATIONS for m in v.values()),
                           f"a mapping from dataset ids to a noise model among {', '.join(EXTRA_PERTURBATIONS)}"),
    "canonical_size": _optional_pos_int,
    "probe": {
        "backend": _choice(PROBE_BACKENDS),
        "device": _str,
        "c_grid": _list_of(lambda x: _is_number(x) and x > 0, "positive numbers"),
        "max_iter": _pos_int,
        "time_cap_s": _pos_number,
        "num_threads": _pos_int,
        "c_selection": _choice(C_SELECTIONS),
    },
    "control_probes": {
        "probes": _list_of(lambda x: x in CONTROL_PROBES, f"probes among {', '.join(CONTROL_PROBES)}", nonempty=False),
        "label_fractions": _fraction_list,
        "conditions": _list_of(lambda x: isinstance(x, str), "condition names"),
    },
    "features": {"cache_dir": _str, "batch_size": _pos_int, "num_workers": _nonneg_int, "device": _str},
    "bootstrap": {"n_resamples": _pos_int, "n_case_resamples": _pos_int},
    "depth": {"pairs": _pairs, "exclude": _list_of(_is_encoder_id, "encoder ids (namespace.name)", nonempty=False)},
    "lora": {"n_seeds": _pos_int, "label_fractions": _fraction_list, "epochs": _pos_int,
             "exclude": _list_of(_is_encoder_id, "encoder ids (namespace.name)", nonempty=False)},
    "manifests": {"name": _scalar(lambda v: isinstance(v, str), "a string (empty: <dataset>.csv) or null")},
    "claims": {"paper_scope": _scalar(lambda v: isinstance(v, bool), "true or false")},
    "book": {"coverage_profile": _scalar(lambda v: isinstance(v, str) and v != "", "a profile name or null")},
    "output_dir": _str,
}
#: The documented defaults of the keys a profile may leave out (a whole section, or keys in one).
DEFAULTS: dict[str, Any] = {
    "description": "",
    "demo_world": None,  # only for data.source: demo_world
    "transfer": {},
    "robustness_transfer": None,  # None: the paper's transfer targets (MIMIC-CXR) enter robustness
    "canonical_size": None,  # [ours] None: the largest input size in the panel (DESIGN.md section 6)
    "noise_model": {},  # beyond the paper: no modality-apt noise model is run beside Rician (DESIGN.md section 6)
    "data": {"images": "all", "folders": {}, "subsample": {}, "split_fractions": [0.7, 0.1, 0.2]},
    "probe": {"c_selection": "nested_val"},  # [ours] C chosen on a val subset of the same label fraction
    "bootstrap": {"n_case_resamples": 1000},  # [ours] the two-level (seeds x test cases) bootstrap
    # None: the controls run on every label fraction and condition (the paper's "both control probes")
    "control_probes": {"label_fractions": None, "conditions": None},
    # The sections below may be left out whole. pairs None: every cell of an encoder with depth taps that
    # exclude does not leave out is swept.
    "depth": {"pairs": None, "exclude": []},
    # [ours] the demo's LoRA plan (paper.yaml sets the paper's, DESIGN.md section 11; the recipe, linear
    # probe then fine-tune, is crsrepro.run.lora's): 1 seed, 25 % and 100 % labels (the fewest fractions
    # that give a retention), 3 epochs (one of warm-up, two of decay), and three networks, so that the
    # ranking keeps a middle to reorder: the medical TinyCNN, the general-architecture ViT and the random
    # TinyCNN (18 fine-tunes). Left out: EfficientNet-Lite0 (its LoRA step runs at ~37 img/s on one CPU
    # thread against ~200 for the others, benchmarks/lora.py, and its forward at 129 img/s against 1,180:
    # it alone would take about half of the demo's LoRA time) and the three specialist TinyCNNs
    "lora": {"n_seeds": 1, "label_fractions": [0.25, 1.0], "epochs": 3,
             "exclude": ["demo.effnet_lite0", "demo.derm_cnn", "demo.fundus_cnn", "demo.cxr_cnn"]},
    "manifests": {"name": None},  # None: the profile's name
    "claims": {"paper_scope": False},
    "book": {"coverage_profile": None},  # None: chapter 05 shows a note instead of the coverage check
}

_VAR = re.compile(r"\$\{(\w+)\}")


@dataclass(frozen=True)
class DataSection:
    """``data``: where the images come from and how labels are read (DESIGN.md section 3)."""

    source: str  #: ``demo_world`` (generated on first use) or ``local`` (read from ``root``)
    root: str  #: the folder holding one sub-folder per dataset id
    u_policy: str  #: [ours] CheXpert's uncertain labels: ignore | ones | zeros
    split_seed: int  #: [ours] the seed of the fixed test split
    split_fractions: tuple  #: [ours] the (train, val, test) shares of the grouped split
    images: str = "all"  #: ``all`` (strict: a listed image that is missing is an error) or ``present-only``
    folders: dict = dataclasses.field(default_factory=dict)  #: dataset id -> its folder under root, where it differs
    subsample: dict = dataclasses.field(default_factory=dict)  #: [ours] dataset id -> images kept (whole groups)


@dataclass(frozen=True)
class DemoWorldSection:
    """``demo_world``: the generator's parameters (part of every demo dataset's content key)."""

    seed: int
    image_size: int
    n_images: dict


@dataclass(frozen=True)
class ProbeSection:
    """``probe``: the linear probe's budget, the same for every encoder (DESIGN.md section 7)."""

    backend: str  #: torch (batched L-BFGS) | sklearn (the reference)
    device: str
    c_grid: tuple  #: [ours] the C values searched on val macro AUROC
    max_iter: int  #: [ours] optimiser iterations per fit
    time_cap_s: float  #: the paper's equal compute-time cap per fit; hitting it is recorded
    num_threads: int  #: [ours] torch threads while fitting (changes no number, so not in any key)
    c_selection: str = "nested_val"  #: [ours] nested_val (C chosen on val labels of the same fraction) | full_val


@dataclass(frozen=True)
class ControlProbesSection:
    """``control_probes``: the MLP and k-NN controls, their fractions and conditions."""

    probes: tuple
    label_fractions: tuple | None = None  #: None: the profile's label fractions
    conditions: tuple | None = None  #: None: every condition of the grid


@dataclass(frozen=True)
class FeaturesSection:
    """``features``: the feature cache and the extraction batch."""

    cache_dir: str
    batch_size: int
    num_workers: int
    device: str


@dataclass(frozen=True)
class BootstrapSection:
    """``bootstrap``: replicate counts (the paper: 10,000 seed-paired replicates)."""

    n_resamples: int
    n_case_resamples: int = 1000


@dataclass(frozen=True)
class DepthSection:
    """``depth``: the (encoder, dataset) pairs of the layer-depth sweep (DESIGN.md section 11)."""

    pairs: tuple | None  #: ((encoder, dataset), ...); None: every cell of an encoder with depth taps ...
    exclude: tuple  #: ... less the cells of these encoders (only where ``pairs`` is None)


@dataclass(frozen=True)
class LoraSection:
    """``lora``: the LoRA plan (DESIGN.md section 11): the first ``n_seeds`` seeds, the label fractions
    (those the profile has), the epochs of every fine-tune, and the adaptable encoders left out."""

    n_seeds: int
    label_fractions: tuple
    epochs: int
    exclude: tuple


@dataclass(frozen=True)
class ManifestsSection:
    """``manifests``: the name the split manifests carry, ``<dataset>_<name>.csv`` (``<dataset>.csv``
    when empty; the paper's manifests are named so)."""

    name: str  #: resolved: the profile's name when the key is left out


@dataclass(frozen=True)
class ClaimsSection:
    """``claims``: whether the claims page sets the paper's own-profile claims beside this run's."""

    paper_scope: bool  #: true only for a run of the paper's protocol


@dataclass(frozen=True)
class BookSection:
    """``book``: what ``crsrepro book`` runs beside the profile's own stages."""

    coverage_profile: str | None  #: the many-seed profile whose grid chapter 05's coverage check reads


_SECTION_TYPES = {"data": DataSection, "demo_world": DemoWorldSection, "probe": ProbeSection,
                  "control_probes": ControlProbesSection, "features": FeaturesSection,
                  "bootstrap": BootstrapSection, "depth": DepthSection, "lora": LoraSection,
                  "manifests": ManifestsSection, "claims": ClaimsSection, "book": BookSection}


def _frozen(value):
    """Lists as tuples, so a profile's sections are immutable and hashable."""
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    return value


@dataclass(frozen=True)
class Profile:
    """A validated, immutable profile (see the module docstring for every key and its default)."""

    name: str
    source: str  #: the file it was read from (absolute)
    description: str
    data: DataSection
    demo_world: DemoWorldSection | None
    datasets: tuple
    transfer: dict  #: training dataset -> tuple of transfer dataset ids
    robustness_transfer: tuple  #: the transfer targets whose real drop enters robustness
    encoders: tuple
    seeds: tuple
    label_fractions: tuple
    perturbations: tuple
    severities: tuple
    noise_model: dict  #: dataset -> its modality-apt noise model, run beside Rician, outside the paper's score
    canonical_size: int | None
    probe: ProbeSection
    control_probes: ControlProbesSection
    features: FeaturesSection
    bootstrap: BootstrapSection
    depth: DepthSection
    lora: LoraSection
    manifests: ManifestsSection
    claims: ClaimsSection
    book: BookSection
    output_dir: str
    config: dict = dataclasses.field(repr=False, compare=False)  #: the merged YAML, as validated

    @classmethod
    def from_config(cls, config: dict, source: str) -> "Profile":
        sections = {key: (None if config.get(key) is None else
                          kind(**{k: _frozen(v) for k, v in config[key].items()}))
                    for key, kind in _SECTION_TYPES.items()}
        if sections["manifests"].name is None:
            sections["manifests"] = ManifestsSection(config["name"])
        transfer = {k: tuple([v] if isinstance(v, str) else v) for k, v in config["transfer"].items()}
        targets = [t for ts in transfer.values() for t in ts]
        robustness = config["robustness_transfer"]
        if robustness is None:
            from crsrepro.core.vocab import PAPER_DATASETS
            robustness = [t for t in targets if t in PAPER_DATASETS]
        plain = {key: _frozen(config[key]) for key in ("name", "description", "datasets", "encoders", "seeds",
                                                       "label_fractions", "perturbations", "severities",
                                                       "noise_model", "canonical_size", "output_dir")}
        return cls(source=source, transfer=transfer, robustness_transfer=tuple(robustness), config=config,
                   **plain, **sections)

    def resolve_path(self, value: str, *, key: str) -> Path:
        """Expand ``${VAR}`` and make ``value`` absolute (a relative path against the profile file's folder);
        ``key`` names it in errors."""
        def expand(m):
            var = m.group(1)
            if var == "CRSREPRO_HOME":
                return str(crsrepro_home())
            if not os.environ.get(var):
                raise ProfileError(f"profile {self.name!r} ({self.source}): key {key} uses ${{{var}}}, which is "
                                   f"not set; export {var}=/path/to/it")
            return os.environ[var]
        path = Path(os.path.expanduser(_VAR.sub(expand, value)))
        return path if path.is_absolute() else Path(self.source).parent / path

    @property
    def argument(self) -> str:
        """What ``--profile`` takes to load this profile again: the name of a shipped profile, else its file
        (for the commands that error messages name)."""
        shipped = PROFILE_DIR / f"{self.name}.yaml"
        return self.name if Path(self.source) == shipped else self.source

    def dataset_root(self, dataset: str) -> Path:
        """The folder that holds ``dataset`` as released: ``<data.root>/<dataset id>``, or the folder that
        ``data.folders`` names for it."""
        return self.resolve_path(self.data.root, key="data.root") / self.data.folders.get(dataset, dataset)

    @property
    def output_path(self) -> Path:
        return self.resolve_path(self.output_dir, key="output_dir")

    @property
    def feature_cache_path(self) -> Path:
        return self.resolve_path(self.features.cache_dir, key="features.cache_dir")

    def transfer_targets(self, dataset: str) -> tuple:
        """The datasets a probe trained on ``dataset`` is scored on without retraining."""
        return self.transfer.get(dataset, ())

    def all_datasets(self) -> list[str]:
        """The training datasets, then the transfer targets that are not among them.

        >>> load_profile("paper").all_datasets()
        ['isic2019', 'aptos2019', 'chexpert', 'mimic_cxr']
        """
        return list(dict.fromkeys([*self.datasets, *(t for ts in self.transfer.values() for t in ts)]))

    def conditions(self, dataset: str | None = None) -> list[str]:
        """The test conditions: ``clean`` then ``<perturbation>@<severity>`` (DESIGN.md section 7), then, for
        a ``dataset`` that ``noise_model`` names, its modality-apt noise model at each severity (beyond the
        paper, reported beside Rician and kept out of the paper-faithful robustness and CRS). A
        ``noise_model`` entry for a dataset the profile does not train on is ignored, so a profile that
        includes another may narrow its datasets.

        >>> demo = load_profile("demo", overrides={"noise_model": {"chexpert": "poisson_gaussian"}})
        >>> demo.conditions("chexpert")[-1], len(demo.conditions("chexpert")) - len(demo.conditions("isic2019"))
        ('poisson_gaussian@3', 3)
        """
        extra = (self.noise_model[dataset],) if dataset in self.noise_model else ()
        return [CLEAN] + [condition_name(p, s) for p in self.perturbations + extra for s in self.severities]

    def fingerprint(self) -> str:
        """The content key of the validated configuration (what a results table was computed for)."""
        from crsrepro.core.io import content_key
        return content_key(profile=self.config)


def crsrepro_home() -> Path:
    """``$CRSREPRO_HOME`` or ``./.crsrepro``: caches, generated data and results live under it."""
    return Path(os.environ.get("CRSREPRO_HOME") or Path.cwd() / ".crsrepro").absolute()


def check_devices(profile: Profile) -> None:
    """Refuse a profile whose ``probe.device`` or ``features.device`` is a CUDA device this machine lacks,
    in one line that says how to run it on the CPU. Every command that computes calls it before any work
    (``crsrepro run``, ``book``, ``score``); ``crsrepro plan`` reports it and still prints the plan, which
    needs no device.

    Raises
    ------
    ProfileError
        A device is not a torch device, or names a CUDA GPU that is not present.
    """
    import torch

    for key, device in (("probe.device", profile.probe.device), ("features.device", profile.features.device)):
        try:
            parsed = torch.device(device)
        except (RuntimeError, ValueError):
            raise ProfileError(f"profile {profile.name!r} ({profile.source}): key {key} must be a torch device "
                               f"such as cpu or cuda, got {device!r}") from None
        if parsed.type != "cuda":
            continue
        present = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (parsed.index or 0) >= present:
            raise ProfileError(
                f"profile {profile.name!r} ({profile.source}): key {key} is {device!r} but this machine has "
                f"{present if present else 'no'} CUDA GPU{'s' if present > 1 else ''}; to run on the CPU, use a profile "
                f"that says `include: {profile.argument}` and sets probe: {{device: cpu}} and "
                f"features: {{device: cpu}}")


def list_profiles() -> list[str]:
    """The names of the profiles shipped with the package."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def _read_yaml(name_or_path: str | os.PathLike, *, folder: Path | None = None) -> tuple[dict, Path]:
    """The YAML of a shipped profile name or of a file (a relative file path resolves against ``folder``,
    the including profile's folder, when given)."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = PROFILE_DIR / f"{name_or_path}.yaml"
    elif folder is not None and not path.is_absolute():
        path = folder / path
    if not path.is_file():
        raise ProfileError(f"no profile {str(name_or_path)!r}: expected {path} "
                           f"(shipped profiles: {', '.join(list_profiles())})")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ProfileError(f"profile {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ProfileError(f"profile {path} must be a mapping of keys to values")
    return data, path


def _merge(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key in _SECTIONS:
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


_SECTIONS = {k for k, v in SCHEMA.items() if isinstance(v, dict)}


#: Keys a profile never inherits through ``include``: they name its outputs (see the module docstring).
OWN_KEYS = ("name", "output_dir")


def _resolve_includes(data: dict, path: Path, seen: tuple = ()) -> dict:
    if "include" not in data:
        return data
    parent_name = data.pop("include")
    parent, parent_path = _read_yaml(parent_name, folder=path.parent)
    if parent_path.absolute() in seen:
        raise ProfileError(f"profile {path}: include cycle through {parent_name!r}")
    parent = _resolve_includes(parent, parent_path, seen + (parent_path.absolute(),))
    return _merge({k: v for k, v in parent.items() if k not in OWN_KEYS}, data)


def _with_defaults(config: dict) -> dict:
    """``config`` with every optional key of :data:`DEFAULTS` filled in (sections key by key; a section
    whose every key has a default may be left out whole)."""
    out = copy.deepcopy(config)
    for key, default in DEFAULTS.items():
        if key in _SECTIONS and isinstance(default, dict):
            if isinstance(out.get(key), dict):
                out[key] = {**default, **out[key]}
            elif key not in out and set(default) == set(SCHEMA[key]):
                out[key] = copy.deepcopy(default)
        else:
            out.setdefault(key, copy.deepcopy(default))
    return out


def _validate(config: dict, schema: dict, where: str, prefix: str = "") -> None:
    for key in config:
        if key not in schema:
            raise ProfileError(f"profile {where}: unknown key {prefix}{key} "
                               f"(known: {', '.join(sorted(schema))})")
    for key, check in schema.items():
        dotted = f"{prefix}{key}"
        if key not in config:
            raise ProfileError(f"profile {where}: missing key {dotted}")
        value = config[key]
        if value is None and dotted in _NULLABLE:
            continue
        if isinstance(check, dict):
            if not isinstance(value, dict):
                raise ProfileError(f"profile {where}: key {dotted} must be a mapping")
            _validate(value, check, where, dotted + ".")
            continue
        ok, expected = check(value)
        if not ok:
            raise ProfileError(f"profile {where}: key {dotted} must be {expected}, got {value!r}")


_NULLABLE = ({key for key, default in DEFAULTS.items() if default is None}
             | {f"{key}.{k}" for key, section in DEFAULTS.items() if isinstance(section, dict)
                for k, v in section.items() if v is None})


def load_profile(name_or_path: str | os.PathLike = "demo", *, overrides: dict | None = None) -> Profile:
    """Read, merge, fill in defaults and validate a profile.

    Includes merge first, without the included profile's :data:`OWN_KEYS`; then ``name`` defaults to the
    file's name and ``output_dir`` to ``${CRSREPRO_HOME}/<name>/results``, then :data:`DEFAULTS` fill in
    the other optional keys.

    Parameters
    ----------
    name_or_path : str or path
        A shipped profile name (``demo``, ``smoke``, ``paper``, ``real-mini``) or the path of a YAML file.
    overrides : dict, optional
        Keys to override after includes are merged (sections merge key by key).

    Raises
    ------
    ProfileError
        The profile does not exist, or a key is unknown, missing or has a bad value (a repeated seed,
        encoder or dataset; a seed above :data:`SEED_MAX`; a file that takes a shipped profile's name); the
        message names the file and the key.

    Examples
    --------
    >>> load_profile("smoke").name
    'smoke'
    >>> load_profile("paper").conditions()[:2]
    ['clean', 'gaussian_blur@1']
    >>> load_profile("paper").probe.c_selection
    'nested_val'
    """
    data, path = _read_yaml(name_or_path)
    data = _resolve_includes(data, path, (path.absolute(),))
    if overrides:
        data = _merge(data, overrides)
    data.setdefault("name", path.stem)
    where = f"{data['name']!r} ({path})"
    if isinstance(data["name"], str):
        data.setdefault("output_dir", f"${{CRSREPRO_HOME}}/{data['name']}/results")
    data = _with_defaults(data)
    _validate(data, SCHEMA, where)
    if data["name"] in list_profiles() and path.absolute() != PROFILE_DIR / f"{data['name']}.yaml":
        raise ProfileError(f"profile {where}: its name {data['name']!r} (key name, else the file's name) is a "
                           f"shipped profile's, whose results and frame it would replace; give it another name")
    for key in UNIQUE_KEYS:
        repeated = sorted({str(v) for v in data[key] if data[key].count(v) > 1})
        if repeated:
            raise ProfileError(f"profile {where}: key {key} lists {', '.join(repeated)} more than once "
                               "(each would be run, and counted, twice)")
    too_large = [s for s in data["seeds"] if s > SEED_MAX]
    if too_large:
        raise ProfileError(f"profile {where}: key seeds holds {too_large[0]}, above {SEED_MAX} (the largest "
                           "seed numpy takes); use seeds in 0..2**32-1")
    if data["data"]["source"] == "demo_world" and data["demo_world"] is None:
        raise ProfileError(f"profile {where}: data.source is demo_world but key demo_world is missing")
    unknown = set(data["transfer"]) - set(data["datasets"])
    if unknown:
        raise ProfileError(f"profile {where}: key transfer names {sorted(unknown)}, which are not in datasets")
    if 1.0 not in data["label_fractions"]:
        raise ProfileError(f"profile {where}: key label_fractions must include 1.0 (the full-label reference)")
    return Profile.from_config(data, str(path.absolute()))


def as_profile(profile: Profile | str | os.PathLike) -> Profile:
    """``profile`` itself, or :func:`load_profile` of a name or path (for functions that take either)."""
    return profile if isinstance(profile, Profile) else load_profile(profile)
