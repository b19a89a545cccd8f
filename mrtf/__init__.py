"""mrtf: transductive inference for a pilot party that receives trained models.

The library is importable without the CLI or the simulator: see ``mrtf.refinery`` (MrTF),
``mrtf.datafree`` (FedFTG, FedKF), ``mrtf.io`` (bundles, HDF5) and ``mrtf.models`` (zoo).
"""

__version__ = "0.1.0"
