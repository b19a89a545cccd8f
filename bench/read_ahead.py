"""HDF5 read-ahead (mrtf.io.read_ahead) on a real file, for compute on the CPU: the target
neighbourhoods (mrtf.trust.neighbours.target_neighbours, numpy) of MNIST's 60,000 training
images, written as one HDF5 file, read with one chunk ahead (forced: source_chunks reads
ahead only for CUDA) and with the plain loop, alternately.

    python bench/read_ahead.py [--repeats 3] [--block 16384] [--gzip]

``--gzip`` writes ``x`` gzip-compressed (level 4, 256-row storage chunks) instead of as
write_dataset does (uncompressed): the reads then cost decompression.

Prints the seconds of each run and whether the two give the same neighbourhoods.
"""

from __future__ import annotations

import argparse
import gzip
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

import mrtf.trust.neighbours as tn
from mrtf.io.hdf5 import H5Dataset, write_dataset
from mrtf.io.read_ahead import plain_chunks, source_chunks

MNIST = Path("/work/shared/data/mnist/train-images-idx3-ubyte.gz")


def mnist_images(path: Path = MNIST) -> np.ndarray:
    """(60000, 1, 28, 28) uint8 from LeCun's IDX file (16-byte header)."""
    with gzip.open(path) as f:
        raw = np.frombuffer(f.read(), np.uint8, offset=16)
    return raw.reshape(-1, 1, 28, 28)


def _ahead(source, size, device="cpu"):
    return source_chunks(source, size, "cuda")  # a name only: no CUDA call


def _plain(source, size, device="cpu"):
    return plain_chunks(source, size)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--block", type=int, default=16384)
    ap.add_argument("--gzip", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mnist.h5"
        if args.gzip:
            with h5py.File(path, "w") as f:
                f.create_dataset("x", data=mnist_images(), compression="gzip",
                                 compression_opts=4, chunks=(256, 1, 28, 28))
        else:
            write_dataset(path, mnist_images())
        times: dict[str, list[float]] = {"read ahead": [], "plain": []}
        out = {}
        with H5Dataset(path) as ds:
            for _ in range(args.repeats):
                for name, chunks in (("read ahead", _ahead), ("plain", _plain)):
                    tn.source_chunks = chunks
                    t0 = time.perf_counter()
                    out[name] = tn.target_neighbours(ds, block=args.block, device="cpu")
                    times[name].append(time.perf_counter() - t0)
        tn.source_chunks = source_chunks
    for name, ts in times.items():
        print(f"{name}: " + " ".join(f"{t:.2f}" for t in ts) + f" s (median {np.median(ts):.2f})")
    print("same neighbourhoods:", bool(np.array_equal(out["read ahead"], out["plain"])))


if __name__ == "__main__":
    main()
