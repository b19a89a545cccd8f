"""MrTF equations against hand-computed small cases (Eq. 3, 4, 6, 7, 10, 11, 12)."""

import math

import numpy as np
import pytest

from mrtf.refinery import (
    avg_logit,
    avg_prob,
    entropy_weights,
    prototype_targets,
    prototype_targets_dense,
    prototypes,
    rectified_targets,
    stabilized_probs,
    u_t,
)


def softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_eq6_global_std_and_tau():
    # One teacher, 2 samples × 2 classes; logits {0, 2, 2, 0}: mean 1, population std 1.
    logits = np.array([[[0.0, 2.0], [2.0, 0.0]]], dtype=np.float32)
    q = stabilized_probs(logits, tau=4.0)
    s = 1 / (1 + math.exp(-8.0))  # softmax([0, 8])[1]
    np.testing.assert_allclose(q[0], [[1 - s, s], [s, 1 - s]], atol=1e-6)
    # A teacher with 10× larger logits gets the same stabilized probabilities.
    np.testing.assert_allclose(stabilized_probs(10 * logits, tau=4.0), q, atol=1e-6)
    # τ = 1 gives softmax(f / std) = softmax([0, 2]).
    np.testing.assert_allclose(stabilized_probs(logits, tau=1.0)[0, 0],
                               softmax(np.array([0.0, 2.0])), atol=1e-6)


def test_eq6_reference_batch_std_without_tau():
    # Two "inference batches" of one sample each, std 1 and 3; no τ.
    logits = np.array([[[0.0, 2.0], [0.0, 6.0]]], dtype=np.float32)
    q = stabilized_probs(logits, std="batch", batch=1, tau=4.0)
    np.testing.assert_allclose(q[0, 0], softmax(np.array([0.0, 2.0])), atol=1e-6)
    np.testing.assert_allclose(q[0, 1], softmax(np.array([0.0, 2.0])), atol=1e-6)


def test_avg_logit_vs_avg_prob():
    # Teacher 1 is loud on class 0, teacher 2 is mildly sure of class 1 (Sect. 5.1's effect).
    logits = np.array([[[10.0, 0.0]], [[0.0, 3.0]]], dtype=np.float32)
    al = avg_logit(logits)
    np.testing.assert_allclose(al[0], softmax(np.array([5.0, 1.5])), atol=1e-6)
    p1, p2 = softmax(np.array([10.0, 0.0])), softmax(np.array([0.0, 3.0]))
    ap = avg_prob(softmax(logits))
    np.testing.assert_allclose(ap[0], (p1 + p2) / 2, atol=1e-6)
    # Weights are normalised: w = (3, 1) is w = (0.75, 0.25).
    np.testing.assert_allclose(avg_prob(softmax(logits), [3, 1])[0], 0.75 * p1 + 0.25 * p2,
                               atol=1e-6)
    np.testing.assert_allclose(avg_logit(logits, [3, 1])[0],
                               softmax(np.array([7.5, 0.75])), atol=1e-6)


def test_entropy_weights_paper_and_reference():
    probs = np.array([[[1.0, 0.0]], [[0.5, 0.5]]])
    e = np.array([0.0, math.log(2)])
    np.testing.assert_allclose(entropy_weights(probs)[:, 0], softmax(-e), atol=1e-9)
    np.testing.assert_allclose(entropy_weights(probs, "reference")[:, 0], softmax(-e / 2),
                               atol=1e-9)
    assert entropy_weights(probs)[0, 0] == pytest.approx(2 / 3)


def test_u_t_formula_clip_and_fallback():
    c = 10
    assert u_t([1.0, 2.0], c) == pytest.approx(0.25 + 0.75 * 1.5 / math.log(c))
    assert u_t([100.0], c) == 1.0
    assert u_t([0.0], c) == 0.25
    assert u_t([None, 1.0], c) == pytest.approx(0.25 + 0.75 / math.log(c))
    assert u_t([], c) == 0.5
    assert u_t([None, float("nan")], c) == 0.5


def test_eq10_rectified_targets_paper():
    local = np.array([[[1.0, 0.0]], [[0.5, 0.5]]])
    start, agg = np.array([[0.2, 0.8]]), np.array([[0.4, 0.6]])
    u = 0.6
    w = softmax(-np.array([0.0, math.log(2)]))
    expect = u * (w[0] * local[0, 0] + w[1] * local[1, 0]) + 0.2 * (start[0] + agg[0])
    got = rectified_targets(local, start, agg, u)
    np.testing.assert_allclose(got[0], expect, atol=1e-6)
    assert got.sum() == pytest.approx(1.0, abs=1e-6)


def test_eq10_rectified_targets_reference_unnormalised():
    local = np.array([[[1.0, 0.0]], [[0.5, 0.5]]])
    start, agg = np.array([[0.5, 0.5]]), np.array([[0.5, 0.5]])
    u = 0.6
    e = np.array([0.0, math.log(2), math.log(2), math.log(2)]) / 2
    w = softmax(-e)
    allp = np.stack([local[0, 0], local[1, 0], start[0], agg[0]])
    scale = np.array([0.3, 0.3, 0.2, 0.2])
    expect = ((scale * w)[:, None] * allp).sum(0)
    got = rectified_targets(local, start, agg, u, variant="reference")
    np.testing.assert_allclose(got[0], expect, atol=1e-6)
    assert got.sum() < 0.99  # not renormalised


def test_eq11_prototypes_weighted_means():
    targets = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.0, 1.0, 0.0]])
    feats = np.array([[2.0, 0.0], [0.0, 2.0], [4.0, 4.0]])
    protos, mass = prototypes(targets, feats)
    np.testing.assert_allclose(mass, [1.5, 1.5, 0.0])
    np.testing.assert_allclose(protos[0], (feats[0] + 0.5 * feats[1]) / 1.5)
    np.testing.assert_allclose(protos[1], (0.5 * feats[1] + feats[2]) / 1.5)
    np.testing.assert_allclose(protos[2], 0.0)


def test_eq12_targets_hand_case():
    # Prototypes along the axes; a sample at 45° has cos = 1/√2 to both.
    targets = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.5, 0.5, 0.0]])
    feats = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    protos, _ = prototypes(targets, feats)
    cos = lambda a, b: a @ b / np.linalg.norm(a) / np.linalg.norm(b)  # noqa: E731
    expect0 = softmax(-4.0 * (1 - np.array([cos(feats[0], protos[0]),
                                            cos(feats[0], protos[1])])))
    q = prototype_targets_dense(targets, feats, tau=4.0)
    np.testing.assert_allclose(q[0, :2], expect0, atol=1e-6)
    assert q[:, 2].max() == 0.0  # no mass → excluded
    np.testing.assert_allclose(q.sum(1), 1.0, atol=1e-6)
    # reference: softmax(-4 (2 - 2 cos)) = softmax(8 cos) on normalised features
    qr = prototype_targets_dense(targets, feats, variant="reference")
    pn, _ = prototypes(targets, feats / np.linalg.norm(feats, axis=1, keepdims=True))
    c0 = [cos(feats[0], pn[0]), cos(feats[0], pn[1])]
    np.testing.assert_allclose(qr[0, :2], softmax(8.0 * np.array(c0)), atol=1e-6)


@pytest.mark.parametrize("variant", ["paper", "reference"])
@pytest.mark.parametrize("iterations", [1, 3])
def test_faiss_matches_dense(variant, iterations):
    rng = np.random.default_rng(0)
    feats = rng.normal(size=(300, 16)).astype(np.float32)
    targets = softmax(rng.normal(size=(300, 7)) * 2).astype(np.float32)
    targets[:, 3] = 0.0  # a class without mass
    targets /= targets.sum(1, keepdims=True)
    dense = prototype_targets_dense(targets, feats, 4.0, iterations, variant)
    fast = prototype_targets(targets, feats, 4.0, iterations, variant, chunk=128)
    np.testing.assert_allclose(fast, dense, atol=1e-5)
    assert fast[:, 3].max() == 0.0
