#!/usr/bin/env bash
# The GPU check, in one run: every GPU test, the demo on CUDA, the GPU benchmark.
#
#   benchmarks/gpu.sh                 # tests + demo + `benchmarks.run --device cuda --quick`
#   benchmarks/gpu.sh --full-bench    # the same with the full benchmark (a few minutes more)
#   benchmarks/gpu.sh --fetch-wheels  # where a package registry is reachable: download the
#                                     # wheels a bare GPU image lacks into .whl/ (git-ignored)
#
# Steps, each with its own timeout inside one budget (GPU_SH_BUDGET_S, default 480 s, so
# the whole run ends well under 9 minutes; typically about 4):
#   setup      ~20 s  report the machine; install what is missing (see "Packages")
#   gpu-tests ~120 s  CHUNKSTREAM_REQUIRE_GPU=1 pytest -m gpu tests (a CPU torch build fails here,
#                     it does not skip); then the CPU tests of the CUDA logic on this torch
#   demo-host  ~40 s  chunkstream demo --device cuda --buffer host (batches gathered on the host,
#                     copied from pinned slots by the loader's copy)
#   demo-device ~40 s chunkstream demo --device cuda --buffer device (batches gathered on the GPU)
#   overlap    ~90 s  python -m benchmarks.demo_overlap --device cuda: the demo's ms per batch
#                     with each tier against the same steps on a resident batch (1.0x: full
#                     overlap)
#   defaults   ~60 s  python -m benchmarks.gpu_defaults: BatchStream's defaults on CUDA at the
#                     users' geometry (65,536 x 13,741 + 1,736 float32 chunks, batches of 256):
#                     ms per batch from the host tier against the device tier
#   zapbench   ~90 s  python -m benchmarks.zapbench_prefetch --device cuda: BatchStream's
#                     defaults against the users' one-thread prefetcher at the ZAPBench-like
#                     geometry (32 x 100 x 71,721 float32, 7,900 frames in memory): pinned
#                     batch slots on the copy stream vs their pageable buffers (issue 49)
#   bench     ~150 s  python -m benchmarks.run --device cuda --quick (writes cuda.json and
#                     BENCHMARKS.md; both are copied out)
# Everything is logged into $OUT (the device tool's output folder; at most 10 files, all
# written here), or into benchmarks/_data/gpu-run/ when OUT is unset. The last lines
# printed are a summary table; the exit code is non-zero if any step failed.
#
# Packages. torch with CUDA is NOT installed here: it comes from the machine (the lent
# GPU image's python3 holds a CUDA build; on your own box, the environment you run this
# in, or PYTHON=/path/to/python). The rest is installed only if missing: from the wheels
# in .whl/ when that folder exists (a machine with no registry: run --fetch-wheels first
# where one is reachable, and carry .whl along), else with pip from the registry.
# The lent image (python3 3.12, torch 2.11+cu130) lacks zarr, numcodecs, donfig and
# google-crc32c: about 9 MB of wheels. So, for a device session from this checkout:
#   here:   benchmarks/gpu.sh --fetch-wheels
#   there:  run `bash benchmarks/gpu.sh` with carry [".whl"], timeout_s 540
#
# On the lent machine (one H200, no network): two tests need a second GPU and skip there,
# saying so: the two-rank NCCL DDP run and "cuda:1 with no context on GPU 0".
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

WHEELS=(zarr==3.1.6 numcodecs==0.16.6 donfig==0.8.1.post1 google-crc32c==1.9.0)
if [ "${1:-}" = "--fetch-wheels" ]; then
    # The lent image is Python 3.12 on x86-64 (WHEEL_PY overrides the version).
    set -e
    mkdir -p .whl
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
    for spec in "${WHEELS[@]}"; do
        python3 -m pip download -q --no-deps --only-binary=:all: \
            --python-version "${WHEEL_PY:-3.12}" --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
            --platform manylinux2014_x86_64 -d .whl "$spec"
    done
    ls -la .whl && du -sh .whl
    exit 0
fi
QUICK=--quick
[ "${1:-}" = "--full-bench" ] && QUICK=

OUT_DIR=${OUT:-$ROOT/benchmarks/_data/gpu-run}  # the fallback is git-ignored
mkdir -p "$OUT_DIR"
SUMMARY=$OUT_DIR/summary.txt
: >"$SUMMARY"
BUDGET=${GPU_SH_BUDGET_S:-480}
START=$SECONDS
FAILED=0
WORK=$(mktemp -d)
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg

# Run one step: step NAME TIMEOUT_S LOG COMMAND... (its time is capped by what is left).
step() {
    local name=$1 limit=$2 log=$3 left rc t0
    shift 3
    left=$((BUDGET - (SECONDS - START)))
    if ((left < 15)); then
        printf '%-11s SKIPPED: the %s s budget is spent\n' "$name" "$BUDGET" | tee -a "$SUMMARY"
        FAILED=1
        return
    fi
    ((limit > left)) && limit=$left
    t0=$SECONDS
    local shown="$*"
    echo "== $name: ${shown:0:200} (timeout ${limit} s)" >>"$log"
    timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1
    rc=$?
    local what=ok
    ((rc == 124 || rc == 137)) && what="TIMED OUT"
    ((rc != 0 && rc != 124 && rc != 137)) && what=FAILED
    ((rc != 0)) && FAILED=1
    printf '%-11s %-9s rc=%-3s %4s s of %s s  (%s)\n' "$name" "$what" "$rc" \
        $((SECONDS - t0)) "$limit" "$(basename "$log")" | tee -a "$SUMMARY"
}

# -- setup: which python, torch and GPU; install what is missing --------------------------
SETUP=$OUT_DIR/setup.log
: >"$SETUP"
if [ -z "${PYTHON:-}" ]; then
    PYTHON=python3
    if [ -x .venv/bin/python ] && .venv/bin/python -c \
        'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
        PYTHON=$ROOT/.venv/bin/python
    fi
fi
setup() {
    set -e
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    echo "python: $(command -v "$PYTHON")"
    "$PYTHON" - <<'EOF'
import sys, torch
print("python", sys.version.split()[0], "| torch", torch.__version__, "| CUDA", torch.version.cuda)
if torch.version.cuda is None or not torch.cuda.is_available():
    sys.exit("no usable CUDA torch in this python: install a CUDA build of torch "
             "(torch.version.cuda set) or point PYTHON at a python that has one")
for k in range(torch.cuda.device_count()):
    print(f"cuda:{k}", torch.cuda.get_device_name(k))
EOF
    missing=$("$PYTHON" - <<'EOF'
import importlib.util
need = {"zarr": "zarr>=3.0.8,<4", "numcodecs": "numcodecs>=0.13", "donfig": "donfig",
        "google_crc32c": "google-crc32c", "tqdm": "tqdm", "pytest": "pytest>=8",
        "pytest_timeout": "pytest-timeout", "hypothesis": "hypothesis", "psutil": "psutil"}
print(" ".join(spec for mod, spec in need.items() if importlib.util.find_spec(mod) is None))
EOF
)
    echo "missing: ${missing:-nothing}"
    if [ -n "$missing" ]; then
        if compgen -G ".whl/*.whl" >/dev/null; then
            echo "installing the carried wheels from .whl/ into $WORK/site"
            "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
                --target "$WORK/site" .whl/*.whl
        else
            echo "installing from the package registry: $missing"
            # shellcheck disable=SC2086  # one word per requirement
            "$PYTHON" -m pip install -q --target "$WORK/site" $missing
        fi
    fi
    PYTHONPATH="$WORK/site:$ROOT/src" "$PYTHON" -c \
        'import zarr, numcodecs, chunkstream; print("zarr", zarr.__version__, "| numcodecs", numcodecs.__version__, "| chunkstream from", chunkstream.__file__)'
}
step setup 90 "$SETUP" bash -c "$(declare -f setup); PYTHON='$PYTHON' WORK='$WORK' ROOT='$ROOT' setup"
export PYTHONPATH="$WORK/site:$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"

# -- the GPU tests: a skip is a failure here ----------------------------------------------
TESTS=$OUT_DIR/pytest.log
: >"$TESTS"
# A hung test is stopped at 90 s with every thread's stack (faulthandler at 60 s), and
# the others still run.
step gpu-tests 240 "$TESTS" env CHUNKSTREAM_REQUIRE_GPU=1 "$PYTHON" -m pytest -m gpu -rA \
    -p no:cacheprovider --timeout 90 -o faulthandler_timeout=60 --continue-on-collection-errors tests
step cuda-logic 60 "$TESTS" "$PYTHON" -m pytest -q -p no:cacheprovider tests/test_cuda_logic.py

# -- the demo on CUDA, with each tier of its BatchStream; then its overlap -----------------------
DEMO=$OUT_DIR/demo.log
: >"$DEMO"
for tier in host device; do
    step "demo-$tier" 90 "$DEMO" "$PYTHON" -m chunkstream demo --device cuda --buffer "$tier" \
        --no-progress --json --out "$WORK/demo-$tier"
    [ -f "$WORK/demo-$tier/result.json" ] && cat "$WORK/demo-$tier/result.json" >>"$DEMO"
done
step overlap 120 "$DEMO" "$PYTHON" -m benchmarks.demo_overlap --device cuda \
    --data "$WORK/overlap-data" --json "$OUT_DIR/demo_overlap.json"

# -- the defaults on CUDA at the users' geometry (issue 36): host tier vs device tier ----------
DEFAULTS=$OUT_DIR/defaults.log
: >"$DEFAULTS"
step defaults 150 "$DEFAULTS" "$PYTHON" -m benchmarks.gpu_defaults --json "$OUT_DIR/defaults.json"

# -- in memory at the ZAPBench-like geometry (issue 49): pinned slots vs pageable buffers -------
ZAPBENCH=$OUT_DIR/zapbench.log
: >"$ZAPBENCH"
step zapbench 120 "$ZAPBENCH" "$PYTHON" -m benchmarks.zapbench_prefetch --device cuda \
    --rounds 3 --seconds 6

# -- the GPU benchmark ----------------------------------------------------------------------
BENCH=$OUT_DIR/bench.log
: >"$BENCH"
step bench 300 "$BENCH" "$PYTHON" -m benchmarks.run --device cuda $QUICK
[ -f benchmarks/results/cuda.json ] && cp benchmarks/results/cuda.json "$OUT_DIR/cuda.json"
cp BENCHMARKS.md "$OUT_DIR/BENCHMARKS.md" 2>/dev/null || true

# -- summary: the last lines of the output ----------------------------------------------------
{
    echo
    grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" "$TESTS" | tail -n 40
    grep -iE "validation loss|device peak|stall fraction|tier on" "$DEMO" | head -n 10
    grep -E '"(ms_per_batch|tier|mix|share)"' "$DEFAULTS" | head -n 8
    if [ -f "$OUT_DIR/cuda.json" ]; then
        "$PYTHON" - "$OUT_DIR/cuda.json" <<'EOF' || true
import json, sys
r = json.load(open(sys.argv[1]))
o, h, m, b = r.get("overlap", {}), r.get("h2d", {}), r.get("memory", {}), r.get("host_blocking", {})
print(f"bench: overlap ratio {o.get('ratio', float('nan')):.3f} (elapsed over bound); "
      f"H2D {h.get('loader_gbps_median', 0):.1f} GB/s loader vs {h.get('peak_gbps_median', 0):.1f} "
      f"pinned peak; host blocked on a copy: {b.get('blocked')}")
print(f"bench: device peak {m.get('peak_loader_bytes', 0) / 2**20:.0f} MiB vs bound "
      f"{m.get('bound_bytes', 0) / 2**20:.0f} MiB (step's own {m.get('step_bytes', 0) / 2**20:.0f})")
EOF
    fi
    grep -iE "error|Traceback" "$BENCH" | tail -n 3
    echo
    echo "total $((SECONDS - START)) s of a ${BUDGET} s budget; logs in $OUT_DIR"
} >>"$SUMMARY"
cat "$SUMMARY"
rm -rf "$WORK"
exit "$FAILED"
