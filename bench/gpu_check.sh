#!/usr/bin/env bash
# The GPU checks of issue 14, on a CUDA machine with PyTorch but no package registry:
# wheels for what its image lacks (faiss-cpu, mlxtend, flwr and its dependencies) travel in
# .whl/, made here by bench/gpu_wheels.sh. Stages: env, tests, teachers, scale (default all).
# Everything it writes goes under $OUT (default runs/gpu).
set -uo pipefail
OUT=${OUT:-runs/gpu}
mkdir -p "$OUT"
# into the image's own environment (not --target): flwr's console scripts (flower-superlink,
# ...) must sit beside sys.executable, where the deployment test looks for them
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl \
  >/dev/null 2>&1 || { echo "wheel install failed"; exit 2; }
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1 \
  || { echo "mrtf install failed"; exit 2; }
export PATH="$(dirname "$(python3 -c 'import sys; print(sys.executable)')"):$PATH"
for stage in ${@:-env tests teachers scale}; do
  echo "=== $stage $(date -u +%T)"
  case $stage in
    env)
      nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
      nproc; free -g | head -2
      python3 -c "import torch, faiss, h5py, numpy; print('torch', torch.__version__, \
'cuda', torch.cuda.is_available(), torch.version.cuda, 'faiss', faiss.__version__, \
'gpu faiss', hasattr(faiss, 'StandardGpuResources'))"
      mrtf --help | head -3 ;;
    tests)
      timeout 420 python3 -m pytest -q -p no:cacheprovider -rfE 2>&1 | tee "$OUT/pytest.log" \
        | grep -E "passed|failed|error|FAILED|ERROR" | tail -40 ;;
    teachers)
      python3 bench/gpu_teachers.py --K 10 50 --n 65536 --out "$OUT/gpu_teachers.json" ;;
    scale)
      OMP_NUM_THREADS=${THREADS:-8} python3 bench/scale.py --e2e --M ${SCALE_M:-100000 1000000} \
        --K 10 --threads ${THREADS:-8} --dir /tmp/scale \
        && cp /tmp/scale/scale-e2e.json /tmp/scale/scale-e2e.png "$OUT/" ;;
  esac
done
