"""The neighbour vote (neighbour_vote.py) against a brute-force twin, on real digits images."""

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn

from mrtf.errors import InputError
from mrtf.io.hdf5 import ArraySource
from mrtf.models import build_model
from mrtf.refinery import RefineConfig
from mrtf.refinery.neighbour_vote import (
    NeighbourVoteSummary,
    final_probs,
    nearest_rows,
    predict_with_vote,
    vote,
)
from mrtf.refinery.teachers import _softmax_np, teacher_logits
from mrtf.trust.neighbours import reference_rows


@pytest.fixture(scope="module")
def digits():
    d = load_digits()
    return (d.images[:, None] / 16.0).astype(np.float32)[:600], d.target[:600]


@pytest.fixture(scope="module")
def model(digits):
    """A LeNet trained for 60 steps on the first 300 digits (labels used to train only)."""
    x, y = digits
    torch.manual_seed(0)
    net = build_model("lenet", 10, in_channels=1, image_size=8)
    xt, yt = torch.from_numpy(x[:300]), torch.from_numpy(y[:300].astype(np.int64))
    opt = torch.optim.Adam(net.parameters(), 3e-3)
    for step in range(60):
        b = slice((step * 50) % 250, (step * 50) % 250 + 50)
        opt.zero_grad()
        nn.functional.cross_entropy(net(xt[b]), yt[b]).backward()
        opt.step()
    return net.eval()


def brute_force(model: nn.Module, x: np.ndarray, k: int, reference: int):
    """The vote written out: every row's features against the reference rows' by cosine."""
    with torch.inference_mode():
        h, logits = model.forward_features(torch.from_numpy(x))
    h = h.flatten(1).numpy().astype(np.float64)
    p = _softmax_np(logits.numpy())
    ref = reference_rows(len(x), reference)
    hn = h / np.linalg.norm(h, axis=1, keepdims=True)
    sim = hn @ hn[ref].T
    for j, r in enumerate(ref):
        sim[r, j] = -np.inf
    nb = ref[np.argsort(-sim, axis=1, kind="stable")[:, :k]]
    return p, (p + p[nb].sum(1)) / (k + 1), nb


def test_vote_is_the_mean_of_own_and_neighbours_probs():
    p = np.array([[0.9, 0.1], [0.2, 0.8], [0.3, 0.7]], np.float32)
    out = vote(p, np.array([[1, 2], [2, 0], [1, 0]]))
    np.testing.assert_allclose(out[0], [(0.9 + 0.2 + 0.3) / 3, (0.1 + 0.8 + 0.7) / 3], rtol=1e-6)
    assert out.argmax(1).tolist() == [1, 1, 1]  # row 0 is outvoted by its two neighbours


def test_nearest_rows_skips_the_row_itself():
    rng = np.random.default_rng(0)
    feats = rng.normal(size=(50, 8)).astype(np.float32)
    ref = np.arange(0, 50, 2)  # even rows are the reference
    unit = torch.from_numpy(feats[ref] / np.linalg.norm(feats[ref], axis=1, keepdims=True))
    nb = nearest_rows(feats, np.arange(50), unit, ref, 3)
    assert nb.shape == (50, 3)
    assert not any(i in nb[i] for i in range(50))
    assert set(nb.ravel()) <= set(ref.tolist())


@pytest.mark.parametrize("reference", [600, 150])  # the whole target, and a reference subset
def test_vote_equals_brute_force(model, digits, reference):
    x, _ = digits
    out = predict_with_vote(model, ArraySource(x), k=3, reference=reference, batch_size=128,
                            stack="loop")
    p, voted, nb = brute_force(model, x, 3, reference)
    np.testing.assert_allclose(out.probs, p, atol=1e-5)
    assert (out.neighbours == nb).mean() > 0.99  # ties in float32 cosines may reorder
    assert out.neighbours.dtype == np.int32  # held to the end of a refine: half of int64
    np.testing.assert_allclose(out.voted, voted, atol=1e-3)
    assert out.reference == min(reference, len(x))
    assert out.summary() == NeighbourVoteSummary(3, out.reference, out.changed)


def test_vote_changes_labels_toward_the_neighbours(model, digits):
    """On real digits the vote must move some labels, and more of them to right than wrong:
    y is read here only to score."""
    x, y = digits
    out = predict_with_vote(model, ArraySource(x), k=3, stack="loop")
    own, voted = out.probs.argmax(1), out.voted.argmax(1)
    moved = own != voted
    assert moved.sum() > 0
    assert (voted[moved] == y[moved]).sum() > (own[moved] == y[moved]).sum()


def test_final_probs_without_vote_is_the_models_softmax(model, digits):
    x, _ = digits
    probs, out = final_probs(model, ArraySource(x), 0, stack="loop")
    assert out is None
    expect = _softmax_np(teacher_logits([model], ArraySource(x), stack="loop").logits[0])
    np.testing.assert_array_equal(probs, expect)


def test_the_vote_never_reads_labels(model, digits):
    """Shuffled y, same vote: the source's labels are not an input."""
    x, y = digits
    a = final_probs(model, ArraySource(x, y), 3, stack="loop")[0]
    b = final_probs(model, ArraySource(x, np.random.default_rng(1).permutation(y)), 3,
                    stack="loop")[0]
    np.testing.assert_array_equal(a, b)


def test_config_votes_for_adaptive_only():
    assert RefineConfig().vote_k == 3
    assert RefineConfig(method="mrtf").vote_k == 0  # the paper's methods stay the paper's
    assert RefineConfig(neighbour_vote=0).vote_k == 0
    with pytest.raises(InputError, match="neighbour-vote"):
        RefineConfig(neighbour_vote=-1).validate()


def test_refine_cli_reports_the_vote_and_rejects_a_bad_k(digits_federation, tmp_path):
    from click.testing import CliRunner

    from mrtf.cli.main import cli

    received, target, _ = digits_federation
    out = tmp_path / "l.h5"
    r = CliRunner().invoke(cli, ["refine", str(received), "--data", str(target), "--labels",
                                 str(out), "--steps", "5"])
    assert r.exit_code == 0, r.output
    assert "neighbour vote (k = 3, among" in r.output
    bad = tmp_path / "bad.h5"
    r = CliRunner().invoke(cli, ["refine", str(received), "--data", str(target), "--labels",
                                 str(bad), "--neighbour-vote", "-1"])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--neighbour-vote" in lines[0], r.output
    assert not bad.exists()
