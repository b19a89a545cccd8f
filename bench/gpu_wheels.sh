#!/usr/bin/env bash
# Download into .whl/ the wheels that bench/gpu_check.sh installs on a CUDA machine with no
# package registry (the image there has torch, numpy, scikit-learn, h5py, click, ... but not
# these): faiss-cpu, mlxtend, flwr and the flwr dependencies that image lacked on 2026-11-23.
# Versions are this venv's. Run here, in the repository root, with the project's venv active;
# keep .whl/ and .sdata/ out of git (.git/info/exclude) and name them in the device tool's
# `carry`.
set -euo pipefail
# uv (17.8 MB) is left out: flwr runs it only to install a Flower app's own dependencies, which
# no test does, and without it MNIST and USPS fit in the device tool's 64 MiB carry (below)
pkgs="faiss-cpu mlxtend flwr pytest-xdist execnet alembic annotated-types cffi cryptography fastapi
grpcio-health-checking iterators mako prompt-toolkit pycparser pycryptodome pydantic
pydantic-core sqlalchemy greenlet starlette tomli tomli-w typing-inspection tzdata uvicorn
wcwidth skl2onnx"
specs=()
for p in $pkgs; do
  v=$(python -m pip show "$p" 2>/dev/null | sed -n 's/^Version: //p' || true)
  if [ -z "$v" ]; then  # e.g. pytest-xdist: `pip install pytest-xdist` first to carry it
    echo "skipped $p: not installed in this venv"; continue
  fi
  specs+=("$p==$v")
done
plat=()
for n in 2_17 2_24 2_27 2_28 2_34; do plat+=(--platform "manylinux_${n}_x86_64"); done
python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${plat[@]}" --platform manylinux2014_x86_64 -d .whl "${specs[@]}"
du -sh .whl
# the standard datasets the data tests read (../shared/data beside the repository), for a
# machine that has no ../shared: MNIST and USPS (14 MB; carry .sdata too, gpu_check.sh links
# it). MNIST-M (21 MB) does not fit beside the wheels: its three tests fail there, by name.
if [ -d ../shared/data ]; then
  mkdir -p .sdata && cp -r ../shared/data/mnist ../shared/data/usps ../shared/data/SHA256SUMS \
    ../shared/data/README.md .sdata/ && chmod -R u+w .sdata && du -sh .sdata
fi
