"""A refined model's student and metadata (mrtf.io.refined), and FusionConfig's total steps."""

from __future__ import annotations

import torch

from mrtf.datafree.config import FusionConfig
from mrtf.io.bundles import BundleMeta, ReceivedModel, ReceivedSet
from mrtf.io.refined import new_student, refined_meta


def _rs() -> ReceivedSet:
    kw = {"in_channels": 1, "image_size": 8}
    models = [ReceivedModel(f"c{k}.safetensors", BundleMeta(
        arch="lenet", num_classes=10, arch_kwargs=kw, label_counts=[k + 1] * 10, round=r,
        role="local"), {}) for k, r in ((0, 2), (1, 3))]
    return ReceivedSet(models, [])


def test_new_student_is_seeded_and_fits_the_images():
    a, meta = new_student(_rs(), "mlp", 7, None)  # data-free: the received image shape
    b, _ = new_student(_rs(), "mlp", 7, (1, 8, 8))
    assert meta.arch == "mlp" and meta.num_classes == 10 and meta.arch_kwargs["image_size"] == 8
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(),
                                                 b.state_dict().values()))
    assert a(torch.zeros(2, 1, 8, 8)).shape == (2, 10)


def test_refined_meta_sums_counts_and_takes_the_newest_round():
    meta = refined_meta(_rs(), None, "mrtf", {"steps": 5})
    assert meta.role == "refined" and meta.arch == "lenet" and meta.round == 3
    assert meta.label_counts == [3] * 10
    assert meta.extra["mrtf.method"] == "mrtf" and '"steps": 5' in meta.extra["mrtf.config"]


def test_total_steps_become_fedftg_rounds_or_fedkf_steps():
    ftg = FusionConfig(method="fedftg", iterations=10, student_steps=5)
    assert ftg.with_total_steps(120).rounds == 3  # 50 student steps a round, rounded up
    assert ftg.with_total_steps(1).rounds == 1
    assert FusionConfig(method="fedkf").with_total_steps(120).steps == 120
