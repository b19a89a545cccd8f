"""mrtf.trust: calibrated confidence, label-free estimate, selective labeling, and the CLI
options of issue 13 (one line and exit 2 for bad values; shuffled y changes nothing)."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

from mrtf.cli.main import cli
from mrtf.io import H5Dataset, load_received, read_labels
from mrtf.refinery import RefineConfig, refine
from mrtf.trust.calibration import Signals, apply_temperature, calibrate, temperature_for
from mrtf.trust.metrics import ece, ece_floor
from mrtf.trust.selective import risk_coverage, select


def _cli(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def _signals(seed=0, m=200, c=5, k=4):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 2, (k, m, c)).astype(np.float32)
    avg = np.exp(logits.mean(0)) / np.exp(logits.mean(0)).sum(1, keepdims=True)
    return Signals.from_logits(logits, avg, avg), avg


def test_calibrated_confidence_is_a_probability_and_estimate_its_mean():
    s, probs = _signals()
    cal = calibrate(probs, s)
    assert cal.confidence.shape == (200,)
    assert ((cal.confidence > 0) & (cal.confidence < 1)).all()
    assert cal.estimated_accuracy == pytest.approx(float(cal.confidence.mean()), abs=1e-6)
    assert cal.plus_minus >= 0.05
    t = temperature_for(probs, 0.6)
    assert apply_temperature(probs, t).mean() == pytest.approx(0.6, abs=2e-3)


def test_without_the_temperature_fit_the_rest_is_the_same():
    s, probs = _signals()
    full, bare = calibrate(probs, s), calibrate(probs, s, fit_temperature=False)
    np.testing.assert_array_equal(bare.confidence, full.confidence)
    assert (bare.estimated_accuracy, bare.plus_minus, bare.method) == \
        (full.estimated_accuracy, full.plus_minus, full.method)
    assert bare.temperature == 1.0 != full.temperature


def test_temperature_for_is_monotone():
    _, probs = _signals()
    assert temperature_for(probs, 0.9) < temperature_for(probs, 0.5)


def test_ece_and_risk_coverage():
    conf = np.array([0.9, 0.9, 0.6, 0.6])
    ok = np.array([1, 1, 1, 0], bool)
    assert ece(conf, ok) == pytest.approx(0.5 * 0.1 + 0.5 * 0.1)
    cov, acc = risk_coverage(conf, ok, points=4)
    assert acc[-1] == 0.75 and acc[0] == 1.0


def test_ece_floor_is_the_ece_of_a_perfectly_calibrated_confidence():
    # its closed form against the ECE of labels drawn right with probability conf
    rng = np.random.default_rng(0)
    for conf in (rng.beta(5, 2, 1000), rng.uniform(0.1, 1.0, 300)):
        drawn = [ece(conf, rng.random(len(conf)) < conf) for _ in range(300)]
        assert ece_floor(conf) == pytest.approx(np.mean(drawn), rel=0.05)
    assert ece_floor(np.ones(50)) == 0.0  # sure and right: no sampling error
    big = rng.beta(5, 2, 100_000)
    assert ece_floor(big) < ece_floor(big[:1000]) / 5  # shrinks as 1/sqrt(n)


def test_select():
    conf = np.array([0.5, 0.95, 0.7, 0.95, 0.1])
    sel = select(conf, coverage=0.6)
    assert sel.abstained.tolist() == [True, False, False, False, True]
    assert select(conf, min_confidence=0.9).abstained.sum() == 3
    assert select(conf) is None


def test_refine_estimate_and_calibration_never_read_y(digits_federation, tmp_path):
    received, target, _ = digits_federation
    shuffled = tmp_path / "shuffled.h5"
    with h5py.File(target) as src, h5py.File(shuffled, "w") as dst:
        for key in src:
            src.copy(key, dst)
        y = dst["y"][:]
        dst["y"][:] = np.random.default_rng(0).permutation(y)
    rs = load_received(received)
    cfg = RefineConfig(steps=5, seed=0, progress=False)
    with H5Dataset(target) as a:
        ra = refine(rs, a, cfg)
    with H5Dataset(shuffled) as b:
        rb = refine(rs, b, cfg)
    np.testing.assert_array_equal(ra.calibration.confidence, rb.calibration.confidence)
    assert ra.accuracy == rb.accuracy
    # refine attaches the target's neighbourhoods: the full model, not the fallback
    assert "fallback" not in ra.calibration.method
    assert not any("neighbourhoods" in n for n in ra.calibration.notes)


def test_cli_refine_label_score_selective(digits_federation, tmp_path):
    received, target, _ = digits_federation
    labels, model = tmp_path / "l.h5", tmp_path / "m.safetensors"
    r = _cli("refine", received, "--data", target, "--labels", labels, "--model", model,
             "--steps", 5, "--coverage", 0.8)
    assert r.exit_code == 0, r.output
    assert "estimated accuracy" in r.output and "parties flagged" in r.output
    ls = read_labels(labels)
    assert ls.abstained is not None and ls.abstained.sum() == 60
    assert (ls.labels[ls.abstained] == -1).all() and (ls.labels[~ls.abstained] >= 0).all()
    assert ls.calibration["estimated_accuracy"] == pytest.approx(float(ls.confidence.mean()),
                                                                 abs=1e-5)
    png = tmp_path / "p.png"
    r = _cli("score", labels, "--truth", target, "--plot", png)
    assert r.exit_code == 0, r.output
    assert "estimated accuracy" in r.output and "coverage 0.800" in r.output
    assert "a perfectly calibrated one would show" in r.output
    assert png.read_bytes()[:4] == b"\x89PNG"
    r = _cli("label", model, "--data", target, "--labels", tmp_path / "l2.h5",
             "--min-confidence", 0.5)
    assert r.exit_code == 0, r.output
    assert "estimated accuracy" in r.output and "temperature" in r.output
    r = _cli("inspect", received, "--data", target)
    assert r.exit_code == 0, r.output
    assert "verdict" in r.output and "flagged" in r.output


@pytest.mark.parametrize("args,needle", [
    (["--aggregate", "max"], "--aggregate"),
    (["--aggregate", "trimmed:0.5"], "--aggregate"),
    (["--min-confidence", "1.5"], "--min-confidence"),
    (["--coverage", "0"], "--coverage"),
    (["--coverage", "1.2"], "--coverage"),
    (["--coverage", "0.5", "--min-confidence", "0.5"], "not both"),
])
def test_bad_trust_options_are_one_line_exit_2(digits_federation, tmp_path, args, needle):
    received, target, _ = digits_federation
    out = tmp_path / "l.h5"
    r = CliRunner().invoke(cli, ["refine", str(received), "--data", str(target), "--labels",
                                 str(out), *args])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], r.output
    assert not out.exists()


def test_bad_label_options_exit_2(digits_federation, tmp_path):
    received, target, _ = digits_federation
    model = next(received.glob("*.safetensors"))
    r = CliRunner().invoke(cli, ["label", str(model), "--data", str(target), "--labels",
                                 str(tmp_path / "l.h5"), "--min-confidence", "-1"])
    assert r.exit_code == 2
    assert len([ln for ln in r.output.splitlines() if ln.strip()]) == 1


def test_signals_read_by_blocks_equal_the_whole_array():
    """The streaming path reads the local models' logits in blocks that need not divide M."""
    rng = np.random.default_rng(7)
    logits = rng.normal(0, 2, (4, 203, 5)).astype(np.float32)
    avg = np.full((203, 5), 0.2, np.float32)
    whole = Signals.from_logits(logits, avg, avg)
    blocks = Signals.from_logits(logits, avg, avg, block=50)
    np.testing.assert_array_equal(blocks.votes, whole.votes)
    np.testing.assert_allclose(blocks.mean_prob, whole.mean_prob, rtol=1e-6)
    assert blocks.local_confidence == pytest.approx(whole.local_confidence, rel=1e-12)
    assert blocks.pairwise_agreement == pytest.approx(whole.pairwise_agreement, rel=1e-12)


def test_blockwise_calibration_equals_the_whole_matrix():
    """calibrate's block-wise logits and temperature equal the whole-array computation."""
    import numpy as np

    from mrtf.trust import calibration as cal

    rng = np.random.default_rng(0)
    m = 1001
    p = rng.dirichlet(np.full(10, 0.3), size=m).astype(np.float32)
    s = cal.Signals(votes=p, mean_prob=p, averaged=p, consensus=p, local_confidence=0.8,
                    pairwise_agreement=0.5)
    s.neighbours = rng.integers(0, m, size=(m, 10)).astype(np.int32)
    w = np.asarray(cal.COEF)
    np.testing.assert_allclose(cal._logits_full(p, s, w, block=97),
                               cal.features(p, s) @ w[:-1] + w[-1], rtol=0, atol=1e-12)
    assert cal.temperature_for(p, 0.7, block=97) == \
        pytest.approx(cal.temperature_for(p, 0.7, block=m), rel=1e-9)


def test_plus_minus_follows_the_estimate_level():
    """The calibrated estimate's ± is what 9 in 10 out-of-sample estimates at its level held
    (ERROR_BANDS): narrow where estimates were good (≥ 0.85), wide where they were not."""
    from mrtf.trust.calibration import ERROR_BANDS, band_error

    assert [band_error(e) for e in (0.99, 0.85, 0.849, 0.4, 0.39, 0.0)] == \
        [ERROR_BANDS[0][1]] * 2 + [ERROR_BANDS[1][1]] * 2 + [ERROR_BANDS[2][1]] * 2
    assert ERROR_BANDS[0][1] < ERROR_BANDS[1][1] < ERROR_BANDS[2][1]
    s, probs = _signals()
    s.neighbours = np.random.default_rng(0).integers(0, 200, size=(200, 10)).astype(np.int32)
    cal = calibrate(probs, s)
    assert "fallback" not in cal.method
    assert cal.plus_minus == pytest.approx(max(band_error(cal.estimated_accuracy),
                                               2 * np.sqrt(cal.estimated_accuracy
                                                           * (1 - cal.estimated_accuracy) / 200)))
