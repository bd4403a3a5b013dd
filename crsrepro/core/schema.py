"""The results schema, defined once (DESIGN.md sections 7-10).

Everything that names a row of the results table or a per-case array is here:

- the run keys (the columns that identify a row) and the run information beside them;
- the primary protocol, with named constants for its layer and regimes (``final``, ``frozen``, ``lora``);
- :class:`Condition`, the one value type for a test condition (``clean``, ``jpeg@2``, ``mimic_cxr``):
  every module that builds or parses a condition goes through it;
- :func:`case_key`, the keys of the per-case arrays stored beside each full-label row-set;
- :data:`METRICS`, the metrics with their direction, in one table.
"""

from __future__ import annotations

from dataclasses import dataclass

from crsrepro.core.vocab import CLEAN, EXTRA_PERTURBATIONS, LINEAR, NO_RECALIBRATION, PERTURBATIONS, SEVERITIES

#: The columns that identify one row of the results table.
RUN_KEYS = ["encoder", "family", "dataset", "seed", "label_fraction", "condition", "probe", "layer", "regime",
            "recalibrator"]
#: What a row records about its fit, beside its key and its metric.
RUN_INFO = ["probe_C", "converged", "c_rule", "c_tie", "hit_time_cap", "fit_seconds", "rowset"]
COLUMNS = RUN_KEYS + ["metric", "value"] + RUN_INFO
#: A run of the grid, before the probe and its protocol are chosen.
GRID_COLUMNS = ["encoder", "dataset", "seed", "label_fraction", "condition"]
#: The columns of the runs table the analyses read: one row per run and a column per metric (the wide
#: view of the results store, :func:`crsrepro.run.results.runs_table`; ``family`` and
#: ``classwise_ece`` may be there too).
RUN_COLUMNS = (*GRID_COLUMNS, "probe", "layer", "regime", "recalibrator", "auroc", "ece")

#: The layer of the paper's primary protocol: the encoder's final embedding (the depth sweep adds taps).
FINAL = "final"
#: The regimes: a probe on frozen features (the paper's protocol), or LoRA fine-tuning (DESIGN.md 11).
FROZEN = "frozen"
LORA = "lora"
REGIMES = (FROZEN, LORA)

#: The primary protocol: the rows that the four dimensions and the CRS are computed from.
PRIMARY = {"probe": LINEAR, "layer": FINAL, "regime": FROZEN, "recalibrator": NO_RECALIBRATION}


@dataclass(frozen=True)
class Metric:
    """A metric of the results table and its direction."""

    name: str
    higher_is_better: bool


#: The metrics every row-set reports (DESIGN.md section 8), with their direction.
METRICS = {m.name: m for m in (Metric("auroc", True), Metric("ece", False), Metric("classwise_ece", False))}
#: The metrics where a smaller value is better.
LOWER_IS_BETTER = frozenset(name for name, m in METRICS.items() if not m.higher_is_better)


@dataclass(frozen=True, order=True)
class Condition:
    """A test condition: ``clean``, a perturbation at a severity (``jpeg@2``), or a transfer set
    (``mimic_cxr``: the probe scored without retraining on another dataset).

    >>> c = Condition.parse("gaussian_blur@3")
    >>> c.perturbation, c.severity, str(c), c.is_perturbation, c.is_transfer
    ('gaussian_blur', 3, 'gaussian_blur@3', True, False)
    >>> str(Condition.perturbed("jpeg", 2)), Condition.parse("mimic_cxr").is_transfer, Condition.parse("clean").severity
    ('jpeg@2', True, 0)
    """

    name: str
    severity: int = 0

    @classmethod
    def parse(cls, text: str, *, perturbations=PERTURBATIONS + EXTRA_PERTURBATIONS) -> "Condition":
        """Read a condition string; a ``name@severity`` must name one of ``perturbations`` (default: the
        paper's five and the modality noise models a profile's ``noise_model`` may select) at 1, 2 or 3."""
        text = str(text)
        name, sep, severity = text.partition("@")
        if not sep:
            if not name:
                raise ValueError("bad condition '': expected 'clean', '<perturbation>@<1|2|3>' or a dataset id")
            return cls(name)
        if name not in perturbations or severity not in {str(s) for s in SEVERITIES}:
            raise ValueError(f"bad condition {text!r}: expected 'clean' or '<perturbation>@<1|2|3>' "
                             f"with a perturbation among {', '.join(perturbations)}")
        return cls(name, int(severity))

    @classmethod
    def perturbed(cls, perturbation: str, severity: int) -> "Condition":
        return cls(perturbation, int(severity))

    def __str__(self) -> str:
        return f"{self.name}@{self.severity}" if self.severity else self.name

    @property
    def is_clean(self) -> bool:
        return self.name == CLEAN

    @property
    def is_perturbation(self) -> bool:
        return self.severity > 0

    @property
    def is_transfer(self) -> bool:
        return not self.is_clean and not self.is_perturbation

    @property
    def perturbation(self) -> str | None:
        return self.name if self.is_perturbation else None


def condition_name(perturbation: str, severity: int) -> str:
    """The run grid's name of a perturbed test condition.

    >>> condition_name("jpeg", 2)
    'jpeg@2'
    """
    return str(Condition.perturbed(perturbation, severity))


def is_perturbation(condition: str) -> bool:
    """``<perturbation>@<severity>`` conditions (not ``clean``, not a transfer dataset such as ``mimic_cxr``)."""
    return Condition(*_split(condition)).is_perturbation


def is_transfer(condition: str) -> bool:
    """A transfer condition: the probe scored without retraining on another dataset (``mimic_cxr``)."""
    return Condition(*_split(condition)).is_transfer


def severity(condition: str) -> int:
    """The severity of a condition (0 for clean and transfer sets).

    >>> severity("contrast@2"), severity("clean")
    (2, 0)
    """
    return Condition(*_split(condition)).severity


def _split(condition: str) -> tuple[str, int]:
    name, sep, level = str(condition).partition("@")
    return (name, int(level)) if sep else (name, 0)


#: The kinds of per-case arrays: ``probs`` per test condition and recalibrator of the full-label probe,
#: ``fraction`` the clean test probabilities of the probe fitted on a smaller label fraction, and
#: ``labels`` and ``image_id`` per set (the test split ``clean``, which every perturbed condition
#: degrades, the seed's ``val`` split, and each transfer set).
CASE_KINDS = ("probs", "fraction", "labels", "image_id")


def case_key(kind: str, case_set: str, recalibrator: str | None = None) -> str:
    """The key of a per-case array in a row-set's ``cases/<rowset>.npz``.

    ``probs`` arrays are per condition and recalibrator (``probs|jpeg@2|none``); ``labels`` and
    ``image_id`` arrays are per set (``labels|clean``).

    >>> case_key("probs", "clean", "temperature"), case_key("labels", "val")
    ('probs|clean|temperature', 'labels|val')
    """
    if kind not in CASE_KINDS:
        raise ValueError(f"unknown per-case array kind {kind!r} (known: {', '.join(CASE_KINDS)})")
    if kind == "probs":
        return f"probs|{case_set}|{recalibrator or NO_RECALIBRATION}"
    if recalibrator is not None:
        raise ValueError(f"{kind} arrays are per set, not per recalibrator")
    return f"{kind}|{case_set}"


def fraction_case_key(fraction: float) -> str:
    """The key of the clean test probabilities of the probe fitted on label ``fraction`` (< 1).

    >>> fraction_case_key(0.05)
    'fraction|0.05'
    """
    return case_key("fraction", format(float(fraction), "g"))


def parse_case_key(key: str) -> tuple[str, str, str | None]:
    """``(kind, set, recalibrator)`` of a per-case key (recalibrator None for labels and image ids).

    >>> parse_case_key("probs|mimic_cxr|none"), parse_case_key("image_id|clean")
    (('probs', 'mimic_cxr', 'none'), ('image_id', 'clean', None))
    """
    parts = key.split("|")
    if parts[0] not in CASE_KINDS or len(parts) != (3 if parts[0] == "probs" else 2):
        raise ValueError(f"not a per-case array key: {key!r}")
    return parts[0], parts[1], parts[2] if parts[0] == "probs" else None
