"""The two readings of MrTF the refinery offers wherever they differ: the paper's equations
("paper") or the authors' public code ("reference"); see docs/methods.md. Defined here once
for the refinery, its config, the simulator and the Flower config."""

#: follow the paper, or the authors' public code
VARIANTS = ("paper", "reference")
