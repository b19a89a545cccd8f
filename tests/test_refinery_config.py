"""The method table (mrtf/refinery/config.py): which models teach each method."""

import pytest

from mrtf.refinery.config import METHOD_SPECS


@pytest.mark.parametrize("method, start, expected", [
    ("fedavg", "theta_t", []),
    ("feddf", "theta_t", ["a", "b"]),
    ("st", None, ["a", "b"]),
    ("st+rd", "theta_t", ["a", "b", "theta_t", "self"]),
    ("mrtf", None, ["a", "b", "self"]),          # no θ_t received: θ_{t+1} still teaches
    ("adaptive", "theta_t", ["a", "b", "theta_t", "self"]),
])
def test_teacher_list_follows_the_method_row(method, start, expected):
    got = METHOD_SPECS[method].teacher_list(["a", "b"], start, "self")
    assert got == expected
    if METHOD_SPECS[method].teachers == "all":
        assert got[-1] == "self"  # θ_{t+1} last: its softmax is read off the last logits


def test_teacher_list_does_not_alias_the_locals():
    locals_ = ["a"]
    METHOD_SPECS["adaptive"].teacher_list(locals_, None, "self").append("x")
    assert locals_ == ["a"]


def test_class_frequencies_give_shares_and_set_the_class_prior():
    from mrtf.errors import InputError
    from mrtf.refinery.config import RefineConfig

    assert RefineConfig().class_shares is None
    shares = RefineConfig(class_frequencies=(30.0, 10.0, 0.0, 60.0)).class_shares
    assert len(shares) == 4 and sum(shares) == pytest.approx(1.0)
    assert shares[0] == pytest.approx(0.3) and 0 < shares[2] < 1e-5  # floored above 0
    with pytest.raises(InputError, match="leave --class-prior at auto"):
        RefineConfig(class_frequencies=(1.0, 1.0), class_prior="uniform").validate()
