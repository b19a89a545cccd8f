"""native.py: the compiled LeNet kernel's build, cache and fallbacks, and its features against
the models' own conv bodies."""

import os

import pytest
import torch

import mrtf.refinery.native as native
from mrtf.models import build_model
from mrtf.refinery.native import cache_dir, library, native_features

needs_kernel = pytest.mark.skipif(library() is None,
                                  reason="no C compiler or no AVX-512: the kernel is not built")


def _lenets(k: int, **kw) -> list:
    torch.manual_seed(k)
    models = [build_model("lenet", 10, **kw).eval() for _ in range(k)]
    with torch.no_grad():
        for m in models:
            for i in (0, 3):
                m.body[i].bias.normal_(0, 0.1)
    return models


def _hwc(models, x):
    """The models' own post-ReLU conv maps, (B, K, D) in (h, w, c) order."""
    with torch.inference_mode():
        return torch.stack([m.body[:-1](x).permute(0, 2, 3, 1).flatten(1) for m in models], 1)


@needs_kernel
@pytest.mark.parametrize("kw,shape", [({}, (13, 1, 28, 28)),
                                      ({"in_channels": 3, "image_size": 29}, (5, 3, 29, 29)),
                                      ({"image_size": 8}, (9, 1, 8, 8))])  # padding 2
def test_features_match_the_models(kw, shape):
    models = _lenets(3, **kw)
    x = torch.rand(*shape)
    got = native_features(models)(x)
    torch.testing.assert_close(got, _hwc(models, x), rtol=1e-5, atol=1e-5)


@needs_kernel
def test_same_result_at_any_thread_count():
    # each image is computed whole by one thread: splitting the batch changes nothing
    models, x = _lenets(4), torch.rand(37, 1, 28, 28)
    run = native_features(models)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = run(x)
        torch.set_num_threads(3)
        three = run(x)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, three)


@needs_kernel
def test_too_small_images_are_refused():
    with pytest.raises(ValueError, match="do not fit"):
        native_features(_lenets(2))(torch.rand(2, 1, 10, 10))


@needs_kernel
def test_built_once_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MRTF_CACHE", str(tmp_path))
    monkeypatch.setattr(native, "_loaded", {})
    assert library() is not None
    built = list(cache_dir().glob("lenet-*.so"))
    assert len(built) == 1 and cache_dir().is_relative_to(tmp_path)
    stamp = built[0].stat().st_mtime_ns
    monkeypatch.setattr(native, "_loaded", {})  # a new process: found in the cache, not rebuilt
    monkeypatch.setattr(native, "_build", lambda *a: pytest.fail("rebuilt"))
    assert library() is not None
    assert built[0].stat().st_mtime_ns == stamp
    assert sorted(os.listdir(cache_dir())) == [built[0].name]  # no temporary left


@pytest.mark.parametrize("env", [{"MRTF_NATIVE": "0"}, {"CC": "no-such-compiler-here"},
                                 {"CC": "false"}])  # disabled; no compiler; a failing build
def test_no_kernel_means_none(env, tmp_path, monkeypatch):
    monkeypatch.setenv("MRTF_CACHE", str(tmp_path))
    monkeypatch.setattr(native, "_loaded", {})
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert library() is None
    assert native_features(_lenets(2)) is None
    assert not list(tmp_path.rglob("*.so"))  # nothing half-written


def test_unwritable_cache_means_none(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("MRTF_CACHE", str(blocker))  # kernels/ cannot be made under a file
    monkeypatch.setattr(native, "_loaded", {})
    assert library() is None
