"""Nearest neighbours and k-means on any torch device (issue 36), for the refinery (CLR, the
k-means view, the neighbour vote) and the trust signals (mrtf.trust.neighbours).

- :mod:`mrtf.compute.backend`: where they run: faiss-cpu (the CPU path), faiss-gpu, or torch;
- :mod:`mrtf.compute.knn`: exact k-NN by blocked products and top-k;
- :mod:`mrtf.compute.kmeans`: spherical k-means, step for step faiss's;
- :mod:`mrtf.compute.lean_ops`: one-hots and row norms without the CUDA kernel modules a
  refine would load for them alone (host memory).

It imports nothing of mrtf but mrtf.device, so both mrtf.refinery and mrtf.trust can use it.
"""
