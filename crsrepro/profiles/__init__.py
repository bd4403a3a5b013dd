"""Profiles: one YAML file names everything a run depends on (DESIGN.md section 2).

A profile names the datasets, the encoders, the seeds, the label fractions, the perturbations, the
probe budget, the bootstrap size and the output folders. Profiles ship as
``crsrepro/profiles/{demo,smoke,paper}.yaml``; a profile may ``include`` another and override keys.
:func:`load_profile` is the only way to read one, and it validates every key: an unknown key or a bad
value raises :class:`~crsrepro.errors.ProfileError` naming the key.

Paths in a profile may use ``${VAR}`` environment variables. ``${CRSREPRO_HOME}`` defaults to
``./.crsrepro``; relative paths resolve against ``$CRSREPRO_HOME/..`` when it is set, else against the
current working directory. A variable without a value is an error only when that path is used.
"""

from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from crsrepro.errors import ProfileError

PROFILE_DIR = Path(__file__).parent
DATASET_IDS = ("isic2019", "aptos2019", "chexpert", "mimic_cxr")
PERTURBATION_NAMES = ("gaussian_blur", "jpeg", "contrast", "rician_noise", "fov_crop")
PROBE_BACKENDS = ("torch", "sklearn")
CONTROL_PROBES = ("mlp", "knn")
U_POLICIES = ("ignore", "ones", "zeros")
DATA_SOURCES = ("demo_world", "local")


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


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

# The schema: a nested dict whose leaves are checks. Every key a profile may hold is listed here.
SCHEMA: dict[str, Any] = {
    "name": _str,
    "description": _scalar(lambda v: isinstance(v, str), "a string"),
    "data": {
        "source": _choice(DATA_SOURCES),
        "root": _str,
        "u_policy": _choice(U_POLICIES),
        "split_seed": _nonneg_int,
    },
    "demo_world": {"seed": _nonneg_int, "image_size": _pos_int, "n_images": _dataset_counts},
    "datasets": _list_of(lambda x: x in DATASET_IDS[:3], "ids among isic2019, aptos2019, chexpert"),
    "transfer": _scalar(
        lambda v: isinstance(v, dict) and all(k in DATASET_IDS and t in DATASET_IDS for k, t in v.items()),
        "a mapping from a training dataset id to a transfer dataset id",
    ),
    "encoders": _list_of(lambda x: isinstance(x, str) and "." in x, "encoder ids (namespace.name)"),
    "seeds": _list_of(lambda x: _is_int(x) and x >= 0, "non-negative integers"),
    "label_fractions": _fraction_list,
    "perturbations": _list_of(lambda x: x in PERTURBATION_NAMES, f"perturbations among {', '.join(PERTURBATION_NAMES)}", nonempty=False),
    "severities": _list_of(lambda x: x in (1, 2, 3), "severities in 1..3", nonempty=False),
    "canonical_size": _optional_pos_int,
    "probe": {
        "backend": _choice(PROBE_BACKENDS),
        "device": _str,
        "c_grid": _list_of(lambda x: _is_number(x) and x > 0, "positive numbers"),
        "max_iter": _pos_int,
        "time_cap_s": _pos_number,
        "num_threads": _pos_int,
    },
    "control_probes": {
        "probes": _list_of(lambda x: x in CONTROL_PROBES, f"probes among {', '.join(CONTROL_PROBES)}", nonempty=False),
        "label_fractions": _fraction_list,
        "conditions": _list_of(lambda x: isinstance(x, str), "condition names"),
    },
    "features": {"cache_dir": _str, "batch_size": _pos_int, "num_workers": _nonneg_int, "device": _str},
    "bootstrap": {"n_resamples": _pos_int},
    "output_dir": _str,
}
# Keys that a complete profile may leave out.
OPTIONAL = {"demo_world", "canonical_size", "transfer", "description"}

_VAR = re.compile(r"\$\{(\w+)\}")


@dataclass(frozen=True)
class Profile:
    """A validated profile. Sections are plain dicts; use the methods for paths and conditions."""

    name: str
    source: str  # the file it was read from
    config: dict = field(repr=False)

    def __getattr__(self, key):
        try:
            return self.__dict__["config"][key]
        except KeyError:
            raise AttributeError(key) from None

    def resolve_path(self, value: str, *, key: str) -> Path:
        """Expand ``${VAR}`` and make ``value`` absolute; ``key`` names it in errors."""
        def expand(m):
            var = m.group(1)
            if var == "CRSREPRO_HOME":
                return str(crsrepro_home())
            if not os.environ.get(var):
                raise ProfileError(f"profile {self.name!r}: key {key} uses ${{{var}}}, which is not set; "
                                   f"export {var}=/path/to/it")
            return os.environ[var]
        path = Path(os.path.expanduser(_VAR.sub(expand, value)))
        return path if path.is_absolute() else _base_dir() / path

    def dataset_root(self, dataset: str) -> Path:
        """The folder that holds ``dataset`` as released (``<data.root>/<dataset id>``)."""
        return self.resolve_path(self.data["root"], key="data.root") / dataset

    @property
    def output_path(self) -> Path:
        return self.resolve_path(self.config["output_dir"], key="output_dir")

    @property
    def feature_cache_path(self) -> Path:
        return self.resolve_path(self.features["cache_dir"], key="features.cache_dir")

    def all_datasets(self) -> list[str]:
        """The training datasets, then the transfer targets that are not among them.

        >>> load_profile("paper").all_datasets()
        ['isic2019', 'aptos2019', 'chexpert', 'mimic_cxr']
        """
        return list(dict.fromkeys([*self.datasets, *self.transfer.values()]))

    def conditions(self) -> list[str]:
        """The test conditions: ``clean`` then ``<perturbation>@<severity>`` (DESIGN.md section 7)."""
        return ["clean"] + [f"{p}@{s}" for p in self.perturbations for s in self.severities]

    def canonical_size_for(self, dataset: str) -> int | None:
        """The size at which test images are degraded once (None: the stored size)."""
        if self.config.get("canonical_size"):
            return self.config["canonical_size"]
        if self.config.get("demo_world"):
            return self.demo_world["image_size"]
        return None


def crsrepro_home() -> Path:
    """``$CRSREPRO_HOME`` or ``./.crsrepro``: caches, generated data and results live under it."""
    return Path(os.environ.get("CRSREPRO_HOME") or Path.cwd() / ".crsrepro").absolute()


def _base_dir() -> Path:
    home = os.environ.get("CRSREPRO_HOME")
    return Path(home).absolute().parent if home else Path.cwd()


def list_profiles() -> list[str]:
    """The names of the profiles shipped with the package."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def _read_yaml(name_or_path: str | os.PathLike) -> tuple[dict, Path]:
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = PROFILE_DIR / f"{name_or_path}.yaml"
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


def _resolve_includes(data: dict, path: Path, seen: tuple = ()) -> dict:
    if "include" not in data:
        return data
    parent_name = data.pop("include")
    if parent_name in seen:
        raise ProfileError(f"profile {path}: include cycle through {parent_name!r}")
    parent, parent_path = _read_yaml(parent_name)
    parent = _resolve_includes(parent, parent_path, seen + (parent_name,))
    return _merge(parent, data)


def _validate(config: dict, schema: dict, where: str, prefix: str = "") -> None:
    for key in config:
        if key not in schema:
            raise ProfileError(f"profile {where}: unknown key {prefix}{key} "
                               f"(known: {', '.join(sorted(schema))})")
    for key, check in schema.items():
        dotted = f"{prefix}{key}"
        if key not in config:
            if prefix or key not in OPTIONAL:
                raise ProfileError(f"profile {where}: missing key {dotted}")
            continue
        value = config[key]
        if isinstance(check, dict):
            if not isinstance(value, dict):
                raise ProfileError(f"profile {where}: key {dotted} must be a mapping")
            _validate(value, check, where, dotted + ".")
            continue
        ok, expected = check(value)
        if not ok:
            raise ProfileError(f"profile {where}: key {dotted} must be {expected}, got {value!r}")


def load_profile(name_or_path: str | os.PathLike = "demo", *, overrides: dict | None = None) -> Profile:
    """Read, merge and validate a profile.

    Parameters
    ----------
    name_or_path : str or path
        A shipped profile name (``demo``, ``smoke``, ``paper``) or the path of a YAML file.
    overrides : dict, optional
        Keys to override after includes are merged (sections merge key by key).

    Raises
    ------
    ProfileError
        The profile does not exist, or a key is unknown, missing or has a bad value.

    Examples
    --------
    >>> load_profile("smoke").name
    'smoke'
    >>> load_profile("paper").conditions()[:2]
    ['clean', 'gaussian_blur@1']
    """
    data, path = _read_yaml(name_or_path)
    data = _resolve_includes(data, path, (path.stem,))
    if overrides:
        data = _merge(data, overrides)
    _validate(data, SCHEMA, repr(data.get("name", path.stem)))
    if data["data"]["source"] == "demo_world" and "demo_world" not in data:
        raise ProfileError(f"profile {data['name']!r}: data.source is demo_world but key demo_world is missing")
    unknown = set(data.get("transfer", {})) - set(data["datasets"])
    if unknown:
        raise ProfileError(f"profile {data['name']!r}: key transfer names {sorted(unknown)}, "
                           f"which are not in datasets")
    if 1.0 not in data["label_fractions"]:
        raise ProfileError(f"profile {data['name']!r}: key label_fractions must include 1.0 (the full-label reference)")
    return Profile(name=data["name"], source=str(path), config=data)
