"""The demo panel: every encoder builds offline, encodes deterministically, taps its layers, and the
networks take LoRA; the committed weights match their record; the pretraining is deterministic."""

import json
import shutil
import socket

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from crsrepro.encoders import create_encoder, demo, get_encoder_spec, list_encoders
from crsrepro.encoders.registry import NETWORK_TAPS
from crsrepro.encoders.weights import load_state_dict, weights_hash
from crsrepro.core.errors import MissingWeightsError, WrongWeightsError
from crsrepro.profiles import load_profile

SPECS = {spec.id: spec for spec, _ in demo.DEMO_ENCODERS}
NETWORKS = sorted(demo.LORA_TARGETS)


def build(encoder_id, weights=None):
    return create_encoder(encoder_id, weights=weights)  # the registry: the only way in


@pytest.fixture(scope="module")
def pil_images():
    rng = np.random.default_rng(0)
    sizes = [(96, 96)] * 4 + [(120, 100)]  # one image not at the demo size: the resize path
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in sizes]


def test_panel_matches_the_profiles_and_families():
    assert list(SPECS) == list(load_profile("demo").encoders)
    assert set(load_profile("smoke").encoders) <= set(SPECS)
    families = {i: s.family for i, s in SPECS.items()}
    assert {i for i, f in families.items() if f == "specialist"} == {"demo.derm_cnn", "demo.fundus_cnn", "demo.cxr_cnn"}
    assert [i for i, f in families.items() if f == "medical"] == ["demo.med_cnn"]
    assert all(s.loader == "demo" and s.input_size <= 128 for s in SPECS.values())
    assert len(NETWORKS) >= 5 and set(NETWORKS) <= set(SPECS)
    assert [i for i in list_encoders() if i.startswith("demo.")] == list(SPECS)
    assert all(get_encoder_spec(i) is spec for i, spec in SPECS.items())


@pytest.mark.parametrize("encoder_id", list(SPECS))
def test_encodes_pil_images_deterministically(encoder_id, pil_images):
    spec = SPECS[encoder_id]
    first = build(encoder_id).encode_images(pil_images, batch_size=4)
    second = build(encoder_id).encode_images(pil_images, batch_size=2)
    assert first.shape == (len(pil_images), spec.embed_dim) and first.dtype == np.float32
    assert np.isfinite(first).all()
    # rebuilt, other batching: the same up to float32 summation order (pixel PCA: 1,728-term dot products)
    np.testing.assert_allclose(first, second, rtol=1e-5, atol=1e-5)
    assert np.ptp(first, axis=0).max() > 0  # the images are told apart


@pytest.mark.parametrize("encoder_id", list(SPECS))
def test_layer_taps_come_from_one_pass(encoder_id):
    spec = SPECS[encoder_id]
    encoder = build(encoder_id)
    assert spec.layer_taps == (NETWORK_TAPS if encoder_id in NETWORKS else ("final",))
    x = encoder.preprocess(torch.randint(0, 256, (3, 3, 96, 96), dtype=torch.uint8))
    taps = encoder.forward_features(x, layers=spec.layer_taps)
    assert list(taps) == list(spec.layer_taps)
    assert all(t.shape[0] == 3 and t.ndim == 2 and torch.isfinite(t).all() for t in taps.values())
    assert taps["final"].shape[1] == spec.embed_dim
    torch.testing.assert_close(taps["final"], encoder.forward_features(x)["final"])
    if encoder_id in NETWORKS:  # four different blocks, not one tensor four times
        assert len({t.shape[1] for t in taps.values()}) > 1 or not torch.equal(taps["depth25"], taps["depth50"])
    with pytest.raises(ValueError, match="layers"):
        encoder.forward_features(x, layers=("depth60",))


@pytest.mark.parametrize("encoder_id", NETWORKS)
def test_lora_adapts_the_networks(encoder_id):
    from peft import LoraConfig, get_peft_model  # 2.6 s to import: here, not in every xdist worker's collection

    encoder = build(encoder_id)
    model = encoder.model
    targets = [name for name, m in model.named_modules()
               if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))
               and any(name == t or name.endswith("." + t) for t in demo.LORA_TARGETS[encoder_id])]
    assert targets, "LORA_TARGETS names no Conv2d/Linear layer"
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=demo.LORA_TARGETS[encoder_id]))
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    peft_model.train()
    x = encoder.preprocess(torch.randint(0, 256, (2, 3, 96, 96), dtype=torch.uint8))
    out = peft_model(x)  # a fixed direction: a plain sum of a LayerNorm output has no gradient
    (out @ torch.linspace(-1, 1, out.shape[1])).sum().backward()
    grads = [p.grad for n, p in peft_model.named_parameters() if p.requires_grad]
    assert any(g is not None and g.abs().sum() > 0 for g in grads)


def test_committed_weights_match_their_record():
    record = json.loads(demo.WEIGHTS_RECORD.read_text())
    on_disk = {p.name for p in demo.WEIGHTS_DIR.glob("*.safetensors")}
    assert on_disk == set(record["files"])
    needed = {f for s in SPECS.values() if s.loader == "demo" for f in s.weight_files if f.endswith(".safetensors")}
    assert needed == on_disk
    for name, entry in record["files"].items():
        path = demo.WEIGHTS_DIR / name
        assert weights_hash(path) == entry["sha256"]
        assert path.stat().st_size == entry["bytes"] < 1_500_000
    assert record["settings"]["seed"] >= 10_000  # disjoint from the demo world's seed 0


def test_tampered_weights_are_refused(tmp_path, monkeypatch):
    for p in demo.WEIGHTS_DIR.iterdir():
        shutil.copy(p, tmp_path / p.name)
    monkeypatch.setattr(demo, "WEIGHTS_DIR", tmp_path)
    monkeypatch.setattr(demo, "WEIGHTS_RECORD", tmp_path / demo.WEIGHTS_RECORD.name)
    build("demo.derm_cnn")  # an intact copy loads
    tensors = load_file(str(tmp_path / "derm_cnn.safetensors"))
    tensors["blocks.0.0.conv.weight"] += 1e-3
    from safetensors.torch import save_file
    save_file(tensors, str(tmp_path / "derm_cnn.safetensors"))
    with pytest.raises(WrongWeightsError, match="does not match the SHA-256"):
        build("demo.derm_cnn")
    (tmp_path / "fundus_cnn.safetensors").unlink()
    with pytest.raises(MissingWeightsError, match="demo_pretrain"):
        build("demo.fundus_cnn")


def test_effnet_loads_the_packaged_imagenet_weights_offline(monkeypatch):
    def no_network(*args, **kwargs):
        raise OSError("network disabled in this test")
    monkeypatch.setattr(socket, "socket", no_network)
    encoder = build("demo.effnet_lite0")
    path = demo.effnet_weights_path()
    released = load_state_dict(path)
    torch.testing.assert_close(encoder.model.stem[0].weight, released["_conv_stem.weight"])
    torch.testing.assert_close(encoder.model.head[1].running_var, released["_bn1.running_var"])
    assert encoder.weights_hash == weights_hash(path)
    with pytest.raises(MissingWeightsError, match="does not exist"):
        build("demo.effnet_lite0", weights=path.parent / "nothing.pth")


def test_random_baselines_are_fixed_and_leave_the_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    first = build("demo.random_vit")
    assert torch.equal(torch.rand(3), expected)
    assert first.weights_hash == build("demo.random_vit").weights_hash
    assert build("demo.random_cnn").weights_hash == build("demo.random_cnn").weights_hash
    with pytest.raises(WrongWeightsError, match="takes no weights"):
        build("demo.random_cnn", weights="some.safetensors")


def test_classical_extractors_on_a_flat_image():
    flat = torch.full((1, 3, 96, 96), 0.5)
    texture = demo.Texture()(flat)[0]
    assert texture.shape == (54,)
    per_scale = texture.view(3, 18)
    assert torch.allclose(per_scale[:, :8], torch.zeros(3, 8), atol=1e-6)  # no Gabor energy
    assert torch.equal(per_scale[:, 8:], torch.eye(10)[8].repeat(3, 1))  # every LBP code is "all >= centre"
    hist = demo.ColorHistogram()(flat)[0]
    assert hist.sum() == 3 and torch.equal(hist.view(3, 16)[:, 8], torch.ones(3))


def test_pixel_pca_projects_like_sklearn():
    from sklearn.decomposition import PCA

    rng = np.random.default_rng(1)
    data = rng.normal(size=(50, 12))
    pca = PCA(n_components=3, svd_solver="full").fit(data)
    module = demo.PixelPCA(torch.from_numpy(pca.mean_), torch.from_numpy(pca.components_))
    np.testing.assert_allclose(module(torch.from_numpy(data).float().view(50, 3, 2, 2)).numpy(),
                               pca.transform(data), rtol=1e-4, atol=1e-5)


def _tiny_corpus(n=12, size=96):
    rng = np.random.default_rng(2)
    images = torch.from_numpy(rng.integers(0, 256, (n, 3, size, size), dtype=np.uint8))
    chexpert = rng.choice([0.0, 1.0, -1.0, np.nan], size=(n, 14))
    return {"isic2019": (images, rng.integers(0, 8, n)), "aptos2019": (images.flip(-1), rng.integers(0, 5, n)),
            "chexpert": (images.flip(-2), chexpert)}


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny batches: threads only add synchronisation on a shared CPU
    yield
    torch.set_num_threads(threads)


def test_pretraining_is_deterministic_and_trains(one_thread):
    from crsrepro.encoders.demo_pretrain import PretrainSettings, pretrain_cnn

    settings = PretrainSettings(epochs=2, batch_size=3)
    corpus = _tiny_corpus(n=6)
    first, loss = pretrain_cnn("med_cnn", corpus, settings, progress=False)
    second, _ = pretrain_cnn("med_cnn", corpus, settings, progress=False)
    assert np.isfinite(loss)
    for (name, a), b in zip(first.state_dict().items(), second.state_dict().values()):
        assert torch.equal(a, b), name
    torch.manual_seed(settings.seed)
    untrained = demo.TinyCNN()
    assert not torch.equal(untrained.state_dict()["blocks.0.0.conv.weight"], first.state_dict()["blocks.0.0.conv.weight"])
    other, _ = pretrain_cnn("derm_cnn", corpus, settings, progress=False)  # another corpus, other weights
    assert not torch.equal(other.state_dict()["blocks.3.1.conv.weight"], first.state_dict()["blocks.3.1.conv.weight"])


def test_pixel_pca_is_fitted_through_the_encoder_preprocessing():
    from crsrepro.encoders.demo_pretrain import fit_pixel_pca

    images = _tiny_corpus(n=80)["isic2019"][0]
    tensors = fit_pixel_pca(images)
    spec = SPECS["demo.pixel_pca"]
    assert tensors["components"].shape == (spec.embed_dim, 3 * spec.input_size ** 2)
    encoder = demo.DemoEncoder(spec, demo.PixelPCA(tensors["mean"], tensors["components"]))
    feats = encoder.forward_features(encoder.preprocess(images))["final"]
    assert feats.mean(dim=0).abs().max() < 1e-3  # centred on the corpus it was fitted on
    variances = feats.var(dim=0)
    assert torch.all(variances[:-1] >= variances[1:] - 1e-4)  # components in decreasing variance


#: The random baselines' weight hashes. Every feature and row-set key of these encoders is made from them, so
#: the committed frames (data_manifests/crs_reference_*.yaml) hold only where these hold.
RANDOM_WEIGHTS = {"demo.random_cnn": "6e130bae2bcb", "demo.random_vit": "0963a368affa"}


@pytest.fixture(scope="module")
def scalar_cpu_hashes():
    """``{encoder id: weights hash}`` of the random baselines built without the CPU's vector code, in one
    subprocess (each start imports torch)."""
    import os
    import subprocess
    import sys

    code = ("from crsrepro.encoders import create_encoder\n"
            f"for e in {sorted(RANDOM_WEIGHTS)!r}: print(e, create_encoder(e).weights_hash)")
    scalar = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            env={**os.environ, "ATEN_CPU_CAPABILITY": "default"})
    return dict(line.split() for line in scalar.stdout.splitlines()[-len(RANDOM_WEIGHTS):])


@pytest.mark.parametrize("encoder_id", sorted(RANDOM_WEIGHTS))
def test_the_random_baselines_are_the_same_bytes_on_every_cpu(encoder_id, scalar_cpu_hashes):
    """PyTorch's own init gave other last bits without the CPU's vector code (ATEN_CPU_CAPABILITY=default), so
    the demo frame was stale on another kind of machine: the weights are drawn by numpy instead."""
    assert build(encoder_id).weights_hash.startswith(RANDOM_WEIGHTS[encoder_id])
    assert scalar_cpu_hashes[encoder_id].startswith(RANDOM_WEIGHTS[encoder_id])
