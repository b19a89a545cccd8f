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
