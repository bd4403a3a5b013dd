"""Feature extraction: order, layer taps, the content-addressed cache, degradation order and resume."""

import json
import subprocess
import sys
import textwrap
import time
import types

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from crsrepro.extract import features
from crsrepro.core.errors import DataError

# A small network behind the Encoder contract; a module file so that a subprocess can build it too.
TINY_ENCODER = textwrap.dedent('''
    import time
    import torch
    from crsrepro.encoders.registry import NETWORK_TAPS, Encoder, EncoderSpec

    SPEC = EncoderSpec(id="test.tiny", family="general", loader="demo", architecture="tiny", input_size=16,
                       mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), interpolation="bilinear", pooling="gap",
                       embed_dim=8, layer_taps=NETWORK_TAPS, licence="none")

    class Tiny(Encoder):
        delay = 0.0
        calls = 0

        def _forward_layers(self, x, layers):
            type(self).calls += 1
            time.sleep(self.delay)
            out = {}
            for name, stage in zip(("depth25", "depth50", "depth75", "final"), self.model):
                x = stage(x)
                out[name] = x.mean(dim=(2, 3))
            return {name: out[name] for name in layers}

    def make(delay=0.0):
        torch.manual_seed(0)
        stages = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Conv2d(3 if i == 0 else 8, 8, 3, padding=1),
                                                           torch.nn.ReLU()) for i in range(4)])
        encoder = Tiny(SPEC, stages)
        encoder.delay = delay
        return encoder
''')


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    (tmp_path / "tiny_encoder.py").write_text(TINY_ENCODER)
    monkeypatch.syspath_prepend(str(tmp_path))
    import tiny_encoder
    return tiny_encoder


def write_images(folder, n=7, fmt="png"):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    rows = []
    for i in range(n):
        path = folder / f"img_{i}.{fmt}"
        Image.fromarray(rng.integers(0, 256, (24 + i, 30, 3), dtype=np.uint8)).save(path)
        rows.append({"image_id": f"img_{i}", "path": str(path)})
    return pd.DataFrame(rows)


def run(encoder, images, cache_dir, **kw):
    kw = {"dataset": "isic2019", "images_key": "m0", "progress": False, **kw}
    return features.extract_features(encoder, images, cache_dir=cache_dir, **kw)


def test_rows_follow_the_table_and_taps_come_from_one_pass(tmp_path, tiny):
    images = write_images(tmp_path / "img")
    encoder = tiny.make()
    out = run(encoder, images, tmp_path / "cache", layers=("depth25", "final"), batch_size=3)
    assert set(out) == {("clean", "depth25"), ("clean", "final")}
    assert out[("clean", "final")].shape == (7, 8) and out[("clean", "final")].dtype == np.float32
    assert tiny.Tiny.calls == 3  # ceil(7 / 3) batches, both taps from the same forward passes
    from crsrepro.data import read_image
    expected = encoder.encode_images([read_image(p) for p in images["path"]])
    np.testing.assert_allclose(out[("clean", "final")], expected, rtol=1e-5, atol=1e-6)
    reversed_rows = run(encoder, images.iloc[::-1], tmp_path / "cache")[("clean", "final")]
    np.testing.assert_allclose(reversed_rows, out[("clean", "final")][::-1], rtol=1e-5, atol=1e-6)


def test_second_call_hits_the_cache_and_the_sidecar_describes_the_entry(tmp_path, tiny):
    images = write_images(tmp_path / "img")
    first = run(tiny.make(), images, tmp_path / "cache", layers=("final", "depth50"))
    tiny.Tiny.calls = 0
    second = run(tiny.make(), images, tmp_path / "cache", layers=("final", "depth50"))
    assert tiny.Tiny.calls == 0
    for pair in first:
        np.testing.assert_array_equal(first[pair], second[pair])
    metas = sorted((tmp_path / "cache").glob("*/*.meta.json"))
    assert len(metas) == 2
    meta = json.loads(metas[0].read_text())
    assert meta["inputs"]["encoder"] == "test.tiny" and meta["inputs"]["images_key"] == "m0"
    assert meta["inputs"]["cache_version"] == features.CACHE_VERSION and meta["shape"][0] == 7
    assert {"torch", "crsrepro"} <= set(meta["versions"]) and "git_hash" in meta
    assert not (tmp_path / "cache" / "partial").exists() or not any((tmp_path / "cache" / "partial").iterdir())


def test_every_input_that_changes_the_bytes_changes_the_key(tmp_path, tiny):
    images = write_images(tmp_path / "img")
    encoder = tiny.make()
    run(encoder, images, tmp_path / "cache")
    for change in ({"images_key": "m1"}, {"dataset": "chexpert"}, {"canonical_size": 12}):
        tiny.Tiny.calls = 0
        run(encoder, images, tmp_path / "cache", **change)
        assert tiny.Tiny.calls > 0, change
    tiny.Tiny.calls = 0
    run(encoder, images.iloc[:5], tmp_path / "cache")
    assert tiny.Tiny.calls > 0


def test_a_half_written_entry_is_never_read(tmp_path, tiny):
    images = write_images(tmp_path / "img")
    good = run(tiny.make(), images, tmp_path / "cache")[("clean", "final")]
    meta = next((tmp_path / "cache").glob("*/*.meta.json"))
    meta.unlink()  # as if killed between the array and its sidecar
    array_path = meta.with_name(meta.name.replace(".meta.json", ".npy"))
    array_path.write_bytes(b"\x93NUMPY garbage")
    (array_path.parent / ".leftover.npy.tmp").write_bytes(b"partial")
    tiny.Tiny.calls = 0
    again = run(tiny.make(), images, tmp_path / "cache")[("clean", "final")]
    assert tiny.Tiny.calls > 0
    np.testing.assert_array_equal(good, again)


def test_each_condition_is_applied_once_at_the_canonical_size(tmp_path, tiny, monkeypatch):
    seen = []

    def apply_condition(image, condition, image_id):
        seen.append((image.shape, condition, image_id))
        return (255 - image) if condition == "invert@1" else image

    from crsrepro.extract.perturb import PERTURBATION_VERSION

    stand_in = types.SimpleNamespace(apply_condition=apply_condition, PERTURBATION_VERSION=PERTURBATION_VERSION)
    monkeypatch.setitem(sys.modules, "crsrepro.extract.perturb", stand_in)
    images = write_images(tmp_path / "img", n=3)
    out = run(tiny.make(), images, tmp_path / "cache", conditions=("clean", "invert@1"), canonical_size=20)
    assert [s[1:] for s in seen] == [("invert@1", f"img_{i}") for i in range(3)]
    assert all(min(shape[:2]) == 20 for shape, _, _ in seen)  # degraded at 20 px, not at the input size 16
    assert not np.allclose(out[("clean", "final")], out[("invert@1", "final")])


def test_workers_give_the_same_features(tmp_path, tiny):
    images = write_images(tmp_path / "img", fmt="jpg")
    serial = run(tiny.make(), images, tmp_path / "a", batch_size=2)[("clean", "final")]
    parallel = run(tiny.make(), images, tmp_path / "b", num_workers=2, batch_size=2)[("clean", "final")]
    np.testing.assert_array_equal(serial, parallel)


def test_a_corrupt_image_names_its_file(tmp_path, tiny):
    images = write_images(tmp_path / "img", n=2)
    with open(images["path"][1], "wb") as f:
        f.write(b"not an image")
    with pytest.raises(DataError, match="img_1.png"):
        run(tiny.make(), images, tmp_path / "cache")


KILLED_RUN = textwrap.dedent('''
    import sys
    import pandas as pd
    sys.path.insert(0, sys.argv[1])
    import tiny_encoder
    from crsrepro.extract.features import extract_features
    images = pd.read_csv(sys.argv[2])
    extract_features(tiny_encoder.make(delay=0.3), images, dataset="isic2019", images_key="m0",
                     cache_dir=sys.argv[3], batch_size=2, chunk_size=4, progress=False)
''')


def test_a_killed_extraction_resumes_with_identical_features(tmp_path, tiny):
    images = write_images(tmp_path / "img", n=16)
    images.to_csv(tmp_path / "images.csv", index=False)
    (tmp_path / "killed.py").write_text(KILLED_RUN)
    cache = tmp_path / "cache"
    proc = subprocess.Popen([sys.executable, str(tmp_path / "killed.py"), str(tmp_path), str(tmp_path / "images.csv"),
                             str(cache)])
    deadline = time.time() + 60
    while not list(cache.glob("partial/*/*.npz")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    assert list(cache.glob("partial/*/*.npz")), "the run should have saved a chunk before being killed"
    assert not list(cache.glob("*/*.meta.json"))
    tiny.Tiny.calls = 0
    resumed = run(tiny.make(), images, cache, batch_size=2, chunk_size=4)[("clean", "final")]
    assert 0 < tiny.Tiny.calls < 8  # finished chunks were not recomputed
    fresh = run(tiny.make(), images, tmp_path / "fresh", batch_size=2, chunk_size=4)[("clean", "final")]
    np.testing.assert_array_equal(resumed, fresh)
    assert not list(cache.glob("partial/*/*"))


def test_a_corrupt_entry_fails_its_sha256_and_is_recomputed(tmp_path, tiny, caplog):
    images = write_images(tmp_path / "img")
    good = run(tiny.make(), images, tmp_path / "cache")[("clean", "final")]
    meta = next((tmp_path / "cache").glob("*/*.meta.json"))
    assert json.loads(meta.read_text())["sha256"] == features.array_sha256(good)
    array_path = meta.with_name(meta.name.replace(".meta.json", ".npy"))
    data = bytearray(array_path.read_bytes())
    data[-5] ^= 0xFF  # one flipped byte in the last feature value; the header stays valid
    array_path.write_bytes(bytes(data))
    tiny.Tiny.calls = 0
    with caplog.at_level("WARNING", logger="crsrepro.extract.features"):
        again = run(tiny.make(), images, tmp_path / "cache")[("clean", "final")]
    assert tiny.Tiny.calls > 0 and "sha256" in caplog.text and array_path.name in caplog.text
    np.testing.assert_array_equal(good, again)
    tiny.Tiny.calls = 0
    run(tiny.make(), images, tmp_path / "cache")  # the rewritten entry passes its check
    assert tiny.Tiny.calls == 0


def test_the_image_cache_degrades_once_for_all_encoders_with_identical_features(tmp_path, tiny, monkeypatch):
    import crsrepro.data
    from crsrepro.extract import perturb

    monkeypatch.setattr(features, "IMAGE_CHUNK_SIZE", 3)  # 7 images: chunks of 3, 3 and 1
    decoded, degraded = [], []
    real_read, real_apply = crsrepro.data.read_image, perturb.apply_condition
    monkeypatch.setattr(crsrepro.data, "read_image", lambda path: decoded.append(path) or real_read(path))
    monkeypatch.setattr(perturb, "apply_condition", lambda *a: degraded.append(a[1:]) or real_apply(*a))
    images = write_images(tmp_path / "img")  # 24..30 x 30 px: ragged at the canonical size 20
    kw = dict(conditions=("clean", "jpeg@2", "rician_noise@1"), layers=("final", "depth50"), canonical_size=20,
              batch_size=2)
    plain = run(tiny.make(), images, tmp_path / "plain", **kw)
    assert len(decoded) == 7 and len(degraded) == 14
    decoded.clear(), degraded.clear()
    first = run(tiny.make(), images, tmp_path / "first", image_cache_dir=tmp_path / "images", **kw)
    assert len(decoded) == 7 and len(degraded) == 14  # the cold image cache: decoded and degraded once
    decoded.clear(), degraded.clear()
    later = run(tiny.make(), images, tmp_path / "later", image_cache_dir=tmp_path / "images", num_workers=2, **kw)
    assert decoded == [] and degraded == []  # a later encoder reads the degraded images
    assert len(list((tmp_path / "images").glob("*/*/*.shapes.npy"))) == 3 * 3
    for pair in plain:
        np.testing.assert_array_equal(first[pair], plain[pair])
        np.testing.assert_array_equal(later[pair], plain[pair])


def test_an_entry_from_before_the_check_gets_its_digest_recorded_not_recomputed(tmp_path, tiny):
    import json

    images = write_images(tmp_path / "img", n=4)
    encoder = tiny.make()
    out = run(encoder, images, tmp_path / "cache")
    meta_path = next((tmp_path / "cache").rglob("*.meta.json"))
    meta = json.loads(meta_path.read_text())
    digest = meta.pop("sha256")
    meta_path.write_text(json.dumps(meta))  # as an earlier version wrote it
    calls = type(encoder).calls
    again = run(encoder, images, tmp_path / "cache")
    assert type(encoder).calls == calls  # read, not recomputed
    assert np.array_equal(again[("clean", "final")], out[("clean", "final")])
    assert json.loads(meta_path.read_text())["sha256"] == digest
