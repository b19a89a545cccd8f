"""mrtf.trust.calibration's temperature fit in torch (device "cpu", and CUDA where present)
against its numpy path, on a real classifier's softmax (digits)."""

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression

import mrtf.trust.calibration as cal

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="module")
def probs():
    """A weak logistic regression's softmax on all 1,797 digits, float32, some rows sure
    enough that the clip at 1e-12 matters for their log."""
    d = load_digits()
    clf = LogisticRegression(C=0.05, max_iter=300).fit(d.data[:200] / 16.0, d.target[:200])
    p = clf.predict_proba(d.data / 16.0).astype(np.float32)
    p[:5] = np.eye(10, dtype=np.float32)[:5]  # exactly one-hot rows: log 0 clipped
    return p


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("target", [0.35, 0.6, 0.93, 0.999])
def test_torch_temperature_equals_numpy(probs, device, target):
    want = cal.temperature_for(probs, target, block=500)
    got = cal.temperature_torch(probs, target, device, block=500)
    assert got == pytest.approx(want, rel=1e-9)
    reached = cal.apply_temperature(probs, got).mean()
    if target < 0.95:  # the fit reached its target
        np.testing.assert_allclose(reached, target, atol=1e-6)
    else:  # beyond what T ≥ 0.05 can reach: both stop at the clip
        assert want == pytest.approx(0.05, rel=1e-6) and reached < target


def test_the_cpu_keeps_numpy(probs, monkeypatch):
    """device "cpu" (the default) never reaches the torch fit; another device does."""
    want = cal.temperature_for(probs, 0.7)
    monkeypatch.setattr(cal, "temperature_torch", None)  # calling it would fail
    assert cal.temperature_for(probs, 0.7, device="cpu") == want
    with pytest.raises(TypeError):
        cal.temperature_for(probs, 0.7, device="meta")
