"""The package's vocabulary, defined once (DESIGN.md sections 3-9).

Every module that needs a dataset id, a task, a perturbation, a probe or a recalibrator name, or the
definition of the primary protocol imports it from here (the results schema, :mod:`crsrepro.core.schema`,
holds the run keys, the primary protocol and the condition type).
"""

from __future__ import annotations

#: The paper's datasets (the first three are trained on; MIMIC-CXR is a transfer target only),
#: then the real-image datasets beyond the paper (DESIGN.md section 3).
PAPER_DATASETS = ("isic2019", "aptos2019", "chexpert", "mimic_cxr")
EXTRA_DATASETS = ("isic2017", "kermany_cxr", "nih_cxr14")
DATASET_IDS = PAPER_DATASETS + EXTRA_DATASETS

#: How a dataset's labels are scored (:mod:`crsrepro.core.metrics`): one class per image, or several
#: 0/1 labels with NaN for a masked one.
TASKS = ("multiclass", "multilabel")

#: What a loader does with a listed image that is not on disk: ``all`` (strict: an error naming the
#: csv line) or ``present-only`` (read what exists; count and log the rest, for partial downloads).
IMAGE_POLICIES = ("all", "present-only")

#: CheXpert's uncertain (-1) labels [ours]: masked out (ignore), or read as 1 or 0.
U_POLICIES = ("ignore", "ones", "zeros")

#: The paper's five perturbations, each at severities 1..3 (DESIGN.md section 6).
PERTURBATIONS = ("gaussian_blur", "jpeg", "contrast", "rician_noise", "fov_crop")
#: The modality-apt noise models beyond the paper (which applies MRI's Rician noise to every modality):
#: Poisson-Gaussian photon and read noise for radiographs, signal-dependent sensor noise for photographs.
#: A profile's ``noise_model`` selects one per dataset; they are reported beside Rician and kept out of
#: the paper-faithful robustness and CRS (DESIGN.md section 6).
EXTRA_PERTURBATIONS = ("poisson_gaussian", "sensor_noise")
SEVERITIES = (1, 2, 3)
CLEAN = "clean"

#: The primary probe and the two controls (DESIGN.md section 7).
LINEAR = "linear"
CONTROL_PROBES = ("mlp", "knn")
#: The linear probe's solvers (a profile's ``probe.backend``): the batched L-BFGS in torch and scikit-learn's
#: reference (:mod:`crsrepro.fit.lbfgs`).
PROBE_BACKENDS = ("torch", "sklearn")

#: The four post-hoc recalibrators (DESIGN.md section 8); ``none`` marks the uncalibrated rows.
NO_RECALIBRATION = "none"
RECALIBRATORS = ("temperature", "vector", "isotonic", "dirichlet")

#: The paper's "medical-pretrained" encoders in its transfer test: medical + specialist (DESIGN.md 4).
MEDICAL_FAMILIES = ("medical", "specialist")
