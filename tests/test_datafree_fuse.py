"""Short data-free fusion runs on scikit-learn's real 8×8 digits."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mrtf.data import load_builtin
from mrtf.datafree import FusionConfig, class_ensemble_weights, dump_samples, fuse
from mrtf.datafree.generators import ConditionalGenerator
from mrtf.errors import FusionError, InputError
from mrtf.federated import LocalConfig, average_received, local_train
from mrtf.io.bundles import BundleMeta, load_received, save_bundle
from mrtf.models import build_model

KW = {"in_channels": 1, "image_size": 8}
PARTIES = [(0, 1, 2, 3, 4, 5), (4, 5, 6, 7, 8, 9), (0, 2, 4, 6, 8, 9)]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models run fastest on one thread, and a busy 2-core machine stalls on two."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def digits(one_thread, tmp_path_factory):
    """Three parties with skewed classes (6 of 10 each), trained briefly; 400 held-out digits."""
    ds = load_builtin("digits")
    x, y = torch.from_numpy(ds.x), torch.from_numpy(ds.y)
    perm = torch.from_numpy(np.random.default_rng(0).permutation(len(y)))
    held, train = perm[:400], perm[400:]
    torch.manual_seed(0)
    start = build_model("lenet", 10, **KW)
    out = tmp_path_factory.mktemp("received")
    for k, classes in enumerate(PARTIES):
        idx = train[torch.isin(y[train], torch.tensor(classes))]
        # batch 64: the batch these parties were set up with (LocalConfig's is 16 now)
        local = LocalConfig(steps=120, lr=0.05, batch_size=64)
        res = local_train(start, x[idx], y[idx], 10, local, seed=k)
        meta = BundleMeta(arch="lenet", num_classes=10, arch_kwargs=KW, party=f"p{k}",
                          label_counts=res.label_counts, n_samples=res.n_samples, round=0)
        save_bundle(out / f"p{k}.safetensors", res.model, meta)
    return load_received(out), x[held], y[held]


def _ensemble_kl(received, model, x, y):
    """KL(class-level ensemble ‖ model) on real digits: the target FedFTG distils (Eq. 10)."""
    models = received.by_role("local")
    alpha = class_ensemble_weights([m.meta.label_counts for m in models])[:, y]  # (K, B)
    with torch.no_grad():
        p = sum(a[:, None] * F.softmax(m.build()(x), 1) for a, m in zip(alpha, models))
        log_s = F.log_softmax(model(x), 1)
    return float((p * (p.clamp_min(1e-12).log() - log_s)).sum(1).mean())


FAST = dict(rounds=3, iterations=10, seed=0, progress=False)


def test_fedftg_moves_student_toward_ensemble(digits):
    received, x, y = digits
    avg, _ = average_received(received.by_role("local"))
    before = _ensemble_kl(received, avg, x, y)
    snapshot = [{k: v.clone() for k, v in m.state_dict.items()}
                for m in received.by_role("local")]
    res = fuse(received, FusionConfig(**FAST))
    assert res.method == "fedftg" and "label counts" in res.reason
    assert len(res.history) == 30 and {"gen_loss", "cls", "dis", "md_student"} <= set(
        res.history[0])
    after = _ensemble_kl(received, res.model, x, y)
    assert after < 0.9 * before, (before, after)
    assert not res.model.training
    assert all(torch.equal(snap[k], m.state_dict[k])  # teachers untouched
               for snap, m in zip(snapshot, received.by_role("local")) for k in snap)


def test_fusion_is_deterministic(digits):
    received, _, _ = digits
    cfg = FusionConfig(rounds=1, iterations=3, seed=3, progress=False)
    a, b = fuse(received, cfg), fuse(received, cfg)
    for (k, va), vb in zip(a.model.state_dict().items(), b.model.state_dict().values()):
        assert torch.equal(va, vb), k
    c = fuse(received, FusionConfig(rounds=1, iterations=3, seed=4, progress=False))
    assert any(not torch.equal(va, vc) for va, vc in zip(a.model.state_dict().values(),
                                                           c.model.state_dict().values()))


def test_fedkf_distils_oca_teacher_into_given_student(digits):
    received, x, _ = digits
    teacher, _ = average_received(received.by_role("local"))
    torch.manual_seed(1)
    student = build_model("lenet", 10, **KW)

    def kl(model):
        with torch.no_grad():
            lt, ls = F.log_softmax(teacher(x), 1), F.log_softmax(model(x), 1)
        return float((lt.exp() * (lt - ls)).sum(1).mean())

    res = fuse(received, FusionConfig(method="fedkf", steps=60, student_lr=0.05,
                                      progress=False), student=student)
    assert res.method == "fedkf" and {"ie", "oh", "act", "kl_student"} <= set(res.history[0])
    assert kl(res.model) < 0.8 * kl(student)
    assert not res.warnings


def test_fedkf_single_round_is_skipped_and_keeps_average(digits):
    """Issue 15.3: OCA = ACA is known before training; the work is skipped and said so."""
    received, x, _ = digits
    res = fuse(received, FusionConfig(method="fedkf", steps=5, progress=False))
    assert any(w.startswith("fedkf skipped") and "parameter average" in w
               for w in res.warnings)
    assert res.history == [] and res.generator is None
    avg, _ = average_received(received.by_role("local"))
    with torch.no_grad():
        assert torch.allclose(res.model(x), avg(x), atol=1e-4)


def test_nan_raises_fusion_error(digits):
    received, _, _ = digits
    broken = build_model("lenet", 10, **KW)
    with torch.no_grad():
        broken.classifier[-1].bias.fill_(float("nan"))
    with pytest.raises(FusionError, match="nan"):
        fuse(received, FusionConfig(rounds=1, iterations=2, progress=False), student=broken)
    with pytest.raises(FusionError):
        fuse(received, FusionConfig(method="fedkf", steps=2, progress=False), student=broken)


def test_no_locals_is_an_input_error():
    with pytest.raises(InputError, match="no local models"):
        fuse([], FusionConfig(progress=False))


def test_dump_samples_writes_png_and_nothing_on_failure(tmp_path, digits):
    torch.manual_seed(0)
    gen = ConditionalGenerator(10, (1, 8, 8))
    out = dump_samples(gen, tmp_path / "grid.png", 10, per_class=4, seed=0)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    received, _, _ = digits
    kf = fuse(received, FusionConfig(method="fedkf", steps=2, progress=False,
                                     skip_futile=False))
    dump_samples(kf.generator, tmp_path / "kf.png", 10, per_class=3,
                 teacher=received.models[0].build())
    assert (tmp_path / "kf.png").stat().st_size > 0

    class Broken(ConditionalGenerator):
        def forward(self, z, y):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        dump_samples(Broken(10, (1, 8, 8)), tmp_path / "bad.png", 10)
    assert sorted(os.listdir(tmp_path)) == ["grid.png", "kf.png"]
    with pytest.raises(InputError):
        dump_samples(gen, tmp_path / "missing" / "g.png", 10)


def test_generator_collapse_stops_the_run_early(digits, monkeypatch):
    """Issue 15.3: a collapsed generator stops FedKF minutes in, not after the run."""
    import mrtf.datafree.common as common

    received, _, _ = digits
    monkeypatch.setattr(common, "mean_pairwise_distance", lambda x: 0.0)
    steps = []
    cfg = FusionConfig(method="fedkf", steps=200, progress=False, skip_futile=False)
    import mrtf.datafree.fedkf as fedkf

    real = fedkf.student_step

    def counting(*args, **kwargs):
        steps.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(fedkf, "student_step", counting)
    with pytest.raises(FusionError, match="collapsed by step 50 of 200"):
        fuse(received, cfg)
    assert len(steps) == 50  # checked every 25 steps; two checks in a row
