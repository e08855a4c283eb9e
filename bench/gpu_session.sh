#!/usr/bin/env bash
# The GPU work in as few device calls as possible: the CUDA test binary (every op against the
# CPU backend, the golden tests on --device cuda, LLaDA2 included), then tessera's longest context at
# 24 / 40 / 80 GiB (issue item 4c); separately, the KV cache's speed-ups at LLaDA-8B size. The GPU machine has nvcc and cmake but, by its package list, none of
# tessera's libraries (oneDNN, PCRE2, utf8proc, GTest), so the binaries are built here and carried there.
#
# Here, on the development machine (no GPU needed):
#   bash bench/gpu_session.sh pack
#     configures build-cuda (CUDA, sm_90, warnings as errors, benchmarks on, no -march=native: the GPU
#     machine's processor may lack this one's instructions), builds cuda_tests, forward_bench, moe_bench and tessera
#     (-j${JOBS:-1}), and packs them with the shared libraries that machine lacks and
#     shared/models/stories260K into
#     build-cuda/gpu_pack/tessera-gpu.tar.xz (about 10 MB), checking that the pack and the working tree
#     together stay under the device's 64 MiB transfer.
# The bundled models' weights (models/*/*.safetensors, about 62 MB) would take the transfer over its 64 MiB:
#   bash bench/gpu_session.sh stash-models     # moves them into build-cuda/models-stash (ignored: not sent)
#   bash bench/gpu_session.sh restore-models   # puts them back (do it before any test here needs them)
# There, through the device tool's run, with carry ["build-cuda/gpu_pack"], one stage per call:
#   bash bench/gpu_session.sh all           # tests, then lmax: timeouts 200 + 370 s (the default)
#   bash bench/gpu_session.sh tests         # ./build-cuda/tests/cuda_tests: $OUT/cuda_tests.json, .log
#   bash bench/gpu_session.sh lmax [GIB,..] # forward_bench --lmax (24,40,80): $OUT/lmax.json, .log
#   bash bench/gpu_session.sh cache         # tessera bench, llada-8b: KV cache none / prefix / dual
#   bash bench/gpu_session.sh sparse        # tessera bench, llada-8b at 16k: SparseD vs dense attention
#   bash bench/gpu_session.sh des           # moe_bench: one MoE layer, vanilla vs DES-Seq / DES-Vote
#   bash bench/gpu_session.sh window        # tessera bench, llada-8b: Window-Diffusion vs exact / dual cache
#   bash bench/gpu_session.sh window-ab     # the same window row with cuDNN on and off (graphs built per row)
#   bash bench/gpu_session.sh probe         # where a 1k step's time goes (--profile, ncu), torch eager / compile
#   bash bench/gpu_session.sh final         # the LLaDA-8B table beside torch eager, cuda_tests, SparseD at 64k,
#                                           # the 1k op profile, Window-Diffusion
#   bash bench/gpu_session.sh memory        # the GPU memory generate --json and serve's /metrics report
#   bash bench/gpu_session.sh libs          # issue "GPU speed from the field's own libraries": cuda_tests,
#                                           # cuda_bench (cuDNN vs flash, gather tiles vs fused), forward_bench
#                                           # before / after at llada-8b beside torch_llada.py, step graphs on
#                                           # dual-cache steps, quantized weights (q8_0 / q4_K) vs bf16
#   bash bench/gpu_session.sh graphs        # cuda_tests, then step graphs on / off on dual-cache steps
#   bash bench/gpu_session.sh task [MIN]    # issue #35: tools/train/train_task.py --device cuda for MIN minutes
#                                           # (default 7) from TASK_INIT (default models/tessera-tiny; its weights
#                                           # must travel: KEEP=tessera-tiny bash bench/gpu_session.sh
#                                           # stash-models), exported with its train_summary.json and the log in
#                                           # one file, $OUT/task.tar (tessera-task/, task_train.log: the
#                                           # device gives back at most 8 files); no pack needed (torch only).
#                                           # TASK_ARGS adds train_task.py flags (e.g. "--batch-tokens 65536").
#   bash bench/gpu_session.sh uniform       # issue #29 (DiffusionGemma): its CUDA tests, tessera bench of the
#                                           # mid geometry, every CUDA test, then the real 26B-A4B geometry
# (alone: timeouts 560 / 570 s; if `all` runs out of time in lmax, run `lmax` alone).
# Every device stage first unpacks the pack into build-cuda/ (once per pack), finds cuBLASLt there,
# checks that the binaries load and writes $OUT/env.txt (GPU, driver, what was packed). Each command
# runs under `timeout` (TESTS_TIMEOUT, LMAX_TIMEOUT override the seconds). Without $OUT (run here), the
# outputs go to build-cuda/gpu_out/.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PACK_DIR=build-cuda/gpu_pack
PACK=$PACK_DIR/tessera-gpu.tar.xz
STAMP=build-cuda/.gpu_pack_unpacked  # checksum of the pack whose files are in build-cuda/
LIMIT=$((64 << 20))                  # the device's transfer: working tree + carried paths

die() {
  echo "gpu_session: $*" >&2
  exit 1
}

checksum() { sha256sum "$1" | cut -c1-64; }

# ---- here: build and pack ------------------------------------------------------------------------
pack() {
  export PATH=/usr/local/cuda/bin:$PATH
  command -v nvcc >/dev/null || die "nvcc is not installed (/usr/local/cuda/bin)"
  cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DTESSERA_WERROR=ON -DTESSERA_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DTESSERA_BENCH=ON -DTESSERA_NATIVE=OFF >/dev/null
  cmake --build build-cuda -j"${JOBS:-1}" --target cuda_tests forward_bench moe_bench cuda_bench tessera
  local stage
  stage=$(mktemp -d)
  chmod 755 "$stage"
  mkdir -p "$stage/tests" "$stage/bench" "$stage/gpu-libs"
  cp build-cuda/tests/cuda_tests "$stage/tests/"
  cp build-cuda/bench/forward_bench build-cuda/bench/moe_bench build-cuda/bench/cuda_bench "$stage/bench/"
  cp build-cuda/tessera "$stage/"
  # Shared libraries the binaries load, except glibc, the compiler's runtime and CUDA's (those are
  # there, and newer; NCCL, 218 MB here, comes from the nvidia-nccl wheel beside its PyTorch); the rest
  # (oneDNN, PCRE2, utf8proc, libgomp, OpenCL, Open MPI) travels.
  ldd build-cuda/tests/cuda_tests build-cuda/bench/forward_bench build-cuda/bench/moe_bench build-cuda/bench/cuda_bench \
    build-cuda/tessera | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' |
    sort -u | while read -r name path; do
    case $name in
      ld-linux* | libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | libstdc++.so* | libgcc_s.so*) ;;
      libcublas* | libcudart* | libcuda.so* | libnccl*) ;;
      *) cp -L "$path" "$stage/gpu-libs/$name" ;;
    esac
  done
  local shared=${TESSERA_SHARED_DIR:-$ROOT/../shared}
  if [ -d "$shared/models/stories260K" ]; then
    mkdir -p "$stage/gpu-shared/models"
    cp -r "$shared/models/stories260K" "$stage/gpu-shared/models/"
  else
    echo "gpu_session: $shared/models/stories260K is absent: the Stories260K tests will skip there" >&2
  fi
  chmod -R u+w "$stage"
  {
    echo "packed $(date -u +%Y-%m-%dT%H:%M:%SZ) from $(git rev-parse --short HEAD 2>/dev/null || echo '?')" \
      "($(git status --porcelain 2>/dev/null | wc -l) uncommitted changes)"
    echo "build: CUDA sm_90, Release, -DTESSERA_NATIVE=OFF; $(nvcc --version | tail -1)"
    echo "libraries: $(cd "$stage/gpu-libs" && echo *)"
  } >"$stage/gpu-pack-info.txt"
  mkdir -p "$PACK_DIR"
  rm -f "$PACK_DIR"/*
  XZ_OPT="-6 -T1" tar -C "$stage" -cJf "$PACK" .
  rm -rf "$stage"
  checksum "$PACK" >"$STAMP"  # here the build's own binaries are the packed ones
  # What the device receives: tracked and untracked-not-ignored files, plus the carried pack.
  local tree pack_bytes
  tree=$(git ls-files -z -co --exclude-standard | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}' || true)  # a deleted file is not sent
  pack_bytes=$(stat -c %s "$PACK")
  echo "pack: $PACK $((pack_bytes >> 20)) MiB; working tree $((tree >> 20)) MiB; limit 64 MiB"
  [ $((tree + pack_bytes)) -lt $LIMIT ] || die "the working tree and the pack exceed the device's 64 MiB (stash-models leaves the bundled weights behind)"
  echo 'next, on the GPU: run(command="bash bench/gpu_session.sh all", carry=["build-cuda/gpu_pack"], timeout_s=600)'
}

# ---- there: unpack, environment ------------------------------------------------------------------
OUT=${OUT:-$ROOT/build-cuda/gpu_out}

prepare() {
  mkdir -p "$OUT"
  if [ -f "$PACK" ] && [ "$(cat "$STAMP" 2>/dev/null)" != "$(checksum "$PACK")" ]; then
    chmod -R u+w build-cuda/gpu-shared 2>/dev/null || true
    rm -rf build-cuda/gpu-libs build-cuda/gpu-shared
    if ! tar -C build-cuda -xJf "$PACK" 2>/dev/null; then  # without xz: Python's tarfile reads it
      python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$PACK" build-cuda
    fi
    checksum "$PACK" >"$STAMP"
  fi
  [ -x build-cuda/tests/cuda_tests ] || die "no build-cuda/tests/cuda_tests: run 'pack' here, carry $PACK_DIR"
  if [ -d build-cuda/gpu-libs ]; then
    export LD_LIBRARY_PATH=$ROOT/build-cuda/gpu-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  fi
  # cuBLASLt and NCCL come from that machine's CUDA toolkit (or the pip wheels beside its PyTorch).
  local missing lib dir py_cublas mod
  missing=$(ldd build-cuda/tests/cuda_tests build-cuda/bench/forward_bench build-cuda/tessera 2>/dev/null |
    awk '$2 == "=>" && $3 == "not" {print $1}' | sort -u)
  for lib in $missing; do
    case $lib in libnccl*) mod=nccl ;; *) mod=cublas ;; esac
    py_cublas=$(python3 -c "import nvidia.$mod as m; print(list(m.__path__)[0] + '/lib')" 2>/dev/null || true)
    for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib $py_cublas \
      "$(find /usr/local /usr/lib /opt -name "$lib" -printf '%h\n' 2>/dev/null | head -1)"; do
      if [ -n "$dir" ] && [ -e "$dir/$lib" ]; then
        export LD_LIBRARY_PATH=$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        break
      fi
    done
  done
  # A library still missing, or one too old for the binaries (a GLIBC version, say): stop here.
  if ldd build-cuda/tests/cuda_tests build-cuda/bench/forward_bench build-cuda/tessera 2>&1 |
    grep -E 'not found'; then
    die "shared libraries missing (above)"
  fi
  # cuDNN (loaded at run time by the CUDA backend): the toolkit's, or the pip wheel beside PyTorch.
  local cudnn_dir=""
  for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
    "$(python3 -c 'import nvidia.cudnn, os; print(os.path.dirname(nvidia.cudnn.__file__) + "/lib")' 2>/dev/null)" \
    "$(find / -xdev -name 'libcudnn.so.9' -printf '%h\n' 2>/dev/null | head -1)"; do
    if [ -n "$dir" ] && [ -e "$dir/libcudnn.so.9" ]; then
      cudnn_dir=$dir
      break
    fi
  done
  if [ -n "$cudnn_dir" ]; then
    export LD_LIBRARY_PATH=$cudnn_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export TESSERA_EXPECT_CUDNN=1  # CudaTest.CudnnLoadsWhereExpected: the backend must load it
  fi
  export TESSERA_SOURCE_DIR=$ROOT  # tools/ and tests/reference/ of this copy of the tree
  if [ -d build-cuda/gpu-shared ]; then
    export TESSERA_SHARED_DIR=$ROOT/build-cuda/gpu-shared
  fi
  local py
  for py in "${TESSERA_PYTHON:-}" /usr/bin/python3 python3; do
    if [ -n "$py" ] && "$py" -c 'import numpy' 2>/dev/null; then
      export TESSERA_PYTHON=$py
      break
    fi
  done
  {
    cat build-cuda/gpu-pack-info.txt 2>/dev/null || echo "binaries of this machine's own build-cuda"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1 || true
    echo "TESSERA_PYTHON=${TESSERA_PYTHON:-none with numpy} TESSERA_SHARED_DIR=${TESSERA_SHARED_DIR:-default}"
    echo "libcudnn.so.9: ${cudnn_dir:-not found}"
  } | tee "$OUT/env.txt"
}

# Line-buffered output, so that a command stopped by its timeout still leaves every finished line.
LINEBUF=()
if command -v stdbuf >/dev/null; then LINEBUF=(stdbuf -oL -eL); fi

run_tests() {
  local rc=0
  echo "== cuda_tests (timeout ${1}s)"
  timeout "$1" "${LINEBUF[@]}" ./build-cuda/tests/cuda_tests --gtest_output="json:$OUT/cuda_tests.json" \
    >"$OUT/cuda_tests.log" 2>&1 || rc=$?
  # The relative errors the golden tests print, then gtest's summary (the whole log is in $OUT).
  grep -E 'relative error|^\[  (PASSED|FAILED)  \]|^\[  SKIPPED \] [0-9]+ test|^\[==========\]' \
    "$OUT/cuda_tests.log" || true
  [ "$rc" -eq 0 ] || tail -n 30 "$OUT/cuda_tests.log"
  echo "== cuda_tests exit $rc$([ "$rc" -eq 124 ] && echo ' (timed out)')"
  return "$rc"
}

run_lmax() {
  local rc=0
  echo "== forward_bench --lmax $2 (timeout ${1}s)"
  timeout "$1" "${LINEBUF[@]}" ./build-cuda/bench/forward_bench --geometry llada-8b --device cuda --lengths 0 \
    --lmax "$2" --lmax-ratio 0.5 --lmax-cap 131072 --json "$OUT/lmax.json" 2>&1 | tee "$OUT/lmax.log" || rc=$?
  echo "== forward_bench exit $rc$([ "$rc" -eq 124 ] && echo ' (timed out: rows done so far are in lmax.log)')"
  return "$rc"
}

# tessera bench at llada-8b size on the GPU: run_bench NAME TIMEOUT OPTIONS... writes $OUT/NAME.json / .log.
run_bench() {
  local name=$1 limit=$2 rc=0
  shift 2
  echo "== tessera bench llada-8b $* (timeout ${limit}s)"
  timeout "$limit" "${LINEBUF[@]}" ./build-cuda/tessera bench --geometry llada-8b --device cuda "$@" \
    --json-out "$OUT/$name.json" 2>&1 | tee "$OUT/$name.log" || rc=$?
  echo "== tessera bench exit $rc$([ "$rc" -eq 124 ] && echo ' (timed out)')"
  return "$rc"
}

# The GPU memory that generate (--json device_bytes_in_use) and serve (/metrics
# tessera_device_bytes_in_use) report on the bundled model, beside nvidia-smi's reading of the same device:
# $OUT/generate.json, metrics.txt, memory.log.
run_memory() {
  local port=18431 pid rc=0
  echo "== tessera generate --device cuda (timeout ${1}s)"
  timeout "$1" ./build-cuda/tessera generate --device cuda -p "Once upon a time" --gen-length 32 --no-progress \
    --json >"$OUT/generate.json" 2>"$OUT/generate.log" || rc=$?
  python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); print("generate: device_bytes_in_use",
    j["device_bytes_in_use"], "peak_rss_bytes", j["peak_rss_bytes"], "text", repr(j["text"]))' "$OUT/generate.json" ||
    { rc=1; tail -5 "$OUT/generate.log"; }
  echo "== tessera serve --device cuda, /metrics beside nvidia-smi"
  ./build-cuda/tessera serve --device cuda --port "$port" >"$OUT/serve.log" 2>&1 &
  pid=$!
  timeout "$1" python3 - "$port" "$OUT/metrics.txt" <<'PY' || rc=1
import json, subprocess, sys, time, urllib.request
base = "http://127.0.0.1:" + sys.argv[1]
for _ in range(600):
    try:
        urllib.request.urlopen(base + "/health", timeout=1).read()
        break
    except Exception:
        time.sleep(0.1)
req = urllib.request.Request(base + "/v1/completions", method="POST",
                             data=json.dumps({"prompt": "Once upon a time", "max_tokens": 32}).encode(),
                             headers={"Content-Type": "application/json"})
print("completion:", json.loads(urllib.request.urlopen(req, timeout=60).read())["choices"][0]["text"][:60])
text = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
open(sys.argv[2], "w").write(text)
smi = subprocess.run(["nvidia-smi", "--query-gpu=memory.used,memory.total", "--format=csv,noheader,nounits"],
                     capture_output=True, text=True).stdout.strip()
apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                      capture_output=True, text=True).stdout.strip()
gauge = [l for l in text.splitlines() if l.startswith("tessera_device_bytes_in_use")]
print("/metrics:", gauge or "no tessera_device_bytes_in_use sample")
print("nvidia-smi memory.used, memory.total (MiB):", smi, "; per process (pid, MiB):", apps)
if gauge:
    print("gauge / nvidia-smi used: %.3f" % (float(gauge[0].split()[-1]) / (float(smi.split(",")[0]) * 2**20)))
PY
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" || true
  echo "== memory exit $rc"
  return "$rc"
}

# The libraries' issue in one call (about 8 minutes): every stage under its own timeout, the most
# important first; "before" is the same binary with TESSERA_CUDNN=0 TESSERA_GATHER_GEMM=fused
# TESSERA_STEP_GRAPHS=0 (tessera's own kernels, every launch from the host).
BEFORE=(env TESSERA_CUDNN=0 TESSERA_GATHER_GEMM=fused TESSERA_STEP_GRAPHS=0)
run_libs() {
  local rc=0 q
  run_tests "${TESTS_TIMEOUT:-170}" || rc=$?
  echo "== cuda_bench --only logits,attention"
  timeout 90 "${LINEBUF[@]}" ./build-cuda/bench/cuda_bench --L 4096 --only logits,attention \
    --json "$OUT/cuda_bench.json" 2>&1 | tee "$OUT/cuda_bench.log" || rc=$?
  echo "== forward_bench llada-8b, after (default) then before"
  timeout 90 "${LINEBUF[@]}" ./build-cuda/bench/forward_bench --geometry llada-8b --device cuda \
    --lengths 1024,4096,16384,32768 --ratios 0.5 --reps 2 --json "$OUT/fwd_after.json" 2>&1 |
    tee "$OUT/fwd_after.log" || rc=$?
  timeout 90 "${LINEBUF[@]}" "${BEFORE[@]}" ./build-cuda/bench/forward_bench --geometry llada-8b --device cuda \
    --lengths 1024,4096,16384,32768 --ratios 0.5 --reps 2 --json "$OUT/fwd_before.json" 2>&1 |
    tee "$OUT/fwd_before.log" || rc=$?
  echo "== torch_llada.py (PyTorch eager, same GPU)"
  PYTHONUNBUFFERED=1 timeout 75 python3 bench/torch_llada.py --lengths 1024,4096,16384,32768 --ratios 0.5 \
    --reps 2 --budgets-gib "" --confirm-max 0 --json "$OUT/torch.json" 2>&1 | tee "$OUT/torch.log" || rc=$?
  echo "== dual-cache steps: step graphs on (default) and off"
  for g in 1 0; do
    timeout 60 "${LINEBUF[@]}" env TESSERA_STEP_GRAPHS=$g ./build-cuda/tessera bench --geometry llada-8b \
      --device cuda --prompt-len 1024 --gen-length 256 --block-length 32 --cache dual \
      --json-out "$OUT/graphs_$g.json" 2>&1 | tee "$OUT/graphs_$g.log" || rc=$?
  done
  echo "== quantized weights vs bf16 (llada-8b, llada2-mini)"
  for g in llada-8b llada2-mini; do
    for q in bf16 q8_0 q4_K; do
      timeout 45 "${LINEBUF[@]}" ./build-cuda/bench/forward_bench --geometry $g --device cuda --lengths 1024,4096 \
        --ratios 0.5 --reps 2 --quant $q --json "$OUT/quant_${g}_$q.json" 2>&1 | tee -a "$OUT/quant.log" || rc=$?
    done
  done
  echo "== libs exit $rc"
  return "$rc"
}

# Where a LLaDA-8B step's time goes, and torch.compile beside PyTorch eager (about 5 minutes): the op
# kinds of a 1k / 4k step (each op synchronised), every kernel of a 1k step under Nsight Compute (its
# duration alone, step graphs off), then torch_llada.py eager and torch.compile(max-autotune), regional.
run_probe() {
  local rc=0
  echo "== forward_bench --profile 1 (llada-8b, mask 0.5)"
  timeout 45 "${LINEBUF[@]}" ./build-cuda/bench/forward_bench --geometry llada-8b --device cuda \
    --lengths 1024,4096 --ratios 0.5 --reps 2 --profile 1 2>&1 | tee "$OUT/profile.log" || rc=$?
  echo "== ncu: kernel durations of a 1k step"
  if command -v ncu >/dev/null; then
    timeout "${NCU_TIMEOUT:-75}" ncu --clock-control none --metrics gpu__time_duration.sum --csv \
      --log-file "$OUT/ncu_1k.csv" env TESSERA_STEP_GRAPHS=0 ./build-cuda/bench/forward_bench \
      --geometry llada-8b --device cuda --lengths 1024 --ratios 0.5 --reps 1 >/tmp/ncu_run.log 2>&1 || rc=$?
    xz -T0 -6 "$OUT/ncu_1k.csv" 2>/dev/null || true
    tail -4 /tmp/ncu_run.log
  fi
  echo "== torch_llada.py eager (mask 0.5)"
  PYTHONUNBUFFERED=1 timeout 60 python3 bench/torch_llada.py --lengths 1024,4096,16384,32768 --ratios 0.5 \
    --reps 2 --budgets-gib "" --confirm-max 0 --json "$OUT/torch_eager.json" 2>&1 | tee "$OUT/torch_eager.log" || rc=$?
  echo "== torch_llada.py torch.compile(mode=max-autotune), regional"
  PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor timeout "${COMPILE_TIMEOUT:-170}" python3 \
    bench/torch_llada.py --lengths 1024,4096,16384,32768 --ratios 0.5 --reps 2 --compile max-autotune \
    --json "$OUT/torch_compile.json" >"$OUT/torch_compile.log" 2>&1 || rc=$?
  grep -v "^AUTOTUNE\|^  \(triton\|mm\|bmm\|addmm\)" "$OUT/torch_compile.log" | tail -30
  echo "== probe exit $rc"
  return "$rc"
}

# The LLaDA-8B table at every length and mask ratio beside PyTorch eager, then cuda_tests, SparseD at
# 64k tokens (dense vs rho 0.1 / 0.3: 4 steps with the exact steps at 1 and 2 of 4, so that a dense,
# a selecting and a sparse step's times can be told apart), the op kinds of a 1k step, Window-Diffusion.
run_final() {  # at most 8 files come back: env.txt, fwd.json / .log, torch.json, cuda_tests.json / .log,
  local rc=0    # sparse64k.json, window.json
  echo "== forward_bench llada-8b, 1k-32k, mask 0.1 / 0.5 / 0.9"
  timeout 80 "${LINEBUF[@]}" ./build-cuda/bench/forward_bench --geometry llada-8b --device cuda \
    --lengths 1024,4096,16384,32768 --ratios 0.1,0.5,0.9 --reps 2 --json "$OUT/fwd.json" 2>&1 |
    tee "$OUT/fwd.log" || rc=$?
  echo "== torch_llada.py eager, same lengths and ratios"
  PYTHONUNBUFFERED=1 timeout 60 python3 bench/torch_llada.py --lengths 1024,4096,16384,32768 \
    --ratios 0.1,0.5,0.9 --reps 2 --masked-only --budgets-gib "" --confirm-max 0 --json "$OUT/torch.json" 2>&1 |
    tee /tmp/torch.log || rc=$?
  run_tests "${TESTS_TIMEOUT:-110}" || rc=$?
  echo "== SparseD at 64k tokens (prompt 65472 + 64), 4 steps"
  timeout 150 "${LINEBUF[@]}" ./build-cuda/tessera bench --geometry llada-8b --device cuda --prompt-len 65472 \
    --gen-length 64 --block-length 64 --steps 4 --compare sparse-rho=0.1,sparse-block=128,sparse-skip=0.25 \
    --compare sparse-rho=0.1,sparse-block=128,sparse-skip=0.5 \
    --compare sparse-rho=0.3,sparse-block=128,sparse-skip=0.25 --json-out "$OUT/sparse64k.json" 2>&1 |
    tee /tmp/sparse64k.log || rc=$?
  echo "== forward_bench --profile 1 at 1k"
  timeout 30 "${LINEBUF[@]}" ./build-cuda/bench/forward_bench --geometry llada-8b --device cuda --lengths 1024 \
    --ratios 0.5 --reps 2 --profile 1 2>&1 | grep -A1 "^  1024" || rc=$?
  echo "== Window-Diffusion vs block 32 + dual cache (prompt 1024, 512 tokens)"
  timeout 60 "${LINEBUF[@]}" ./build-cuda/tessera bench --geometry llada-8b --device cuda --prompt-len 1024 \
    --gen-length 512 --block-length 32 --steps 512 --cache dual \
    --compare block-length=512,cache=none,window=on --json-out "$OUT/window.json" 2>&1 | tee /tmp/window.log || rc=$?
  echo "== final exit $rc"
  return "$rc"
}

stage=${1:-all}
case $stage in
  pack) pack ;;
  stash-models)  # here, before the device calls: the weights stay behind in an ignored folder; KEEP names
    # model directories whose weights travel (the task stage: KEEP=tessera-tiny)
    for f in models/*/*.safetensors; do
      [ -e "$f" ] || continue
      case " ${KEEP:-} " in *" $(basename "$(dirname "$f")") "*) continue ;; esac
      mkdir -p "build-cuda/models-stash/$(dirname "$f")"
      mv "$f" "build-cuda/models-stash/$f"
    done
    echo "stashed: $(find build-cuda/models-stash -name '*.safetensors' 2>/dev/null | wc -l) files; run restore-models after"
    ;;
  restore-models)
    [ -d build-cuda/models-stash ] || die "nothing stashed (build-cuda/models-stash is absent)"
    (cd build-cuda/models-stash && find models -name '*.safetensors') | while read -r f; do
      mv "build-cuda/models-stash/$f" "$f"
    done
    rm -rf build-cuda/models-stash
    git status --short -- models | grep . && die "models/ differs from the commit after the restore" || true
    echo "restored"
    ;;
  tests)
    prepare
    run_tests "${TESTS_TIMEOUT:-560}"
    ;;
  lmax)
    prepare
    run_lmax "${LMAX_TIMEOUT:-570}" "${2:-24,40,80}"
    ;;
  all)
    prepare
    rc=0
    run_tests "${TESTS_TIMEOUT:-200}" || rc=$?
    run_lmax "${LMAX_TIMEOUT:-370}" "${2:-24,40,80}" || rc=$?
    exit "$rc"
    ;;
  cache)
    prepare
    run_bench cache "${CACHE_TIMEOUT:-570}" --prompt-len 4096 --gen-length 256 --block-length 32 \
      --compare cache=prefix --compare cache=dual
    ;;
  sparse)
    prepare
    run_bench sparse "${SPARSE_TIMEOUT:-570}" --prompt-len 16320 --gen-length 64 --block-length 64 --steps 32 \
      --compare sparse-rho=0.3,sparse-block=128 --compare sparse-rho=0.1,sparse-block=128
    ;;
  des)
    prepare
    rc=0
    echo "== moe_bench --device cuda"
    timeout "${DES_TIMEOUT:-300}" "${LINEBUF[@]}" ./build-cuda/bench/moe_bench --device cuda --reps 20 \
      --json "$OUT/des.json" 2>&1 | tee "$OUT/des.log" || rc=$?
    echo "== moe_bench exit $rc"
    exit "$rc"
    ;;
  window-ab)  # the 2026-11-26 window regression: cuDNN on / off, with the graphs it built per row
    prepare
    rc=0
    for c in 1 0; do
      echo "== Window-Diffusion, TESSERA_CUDNN=$c"
      timeout 120 "${LINEBUF[@]}" env TESSERA_CUDNN=$c ./build-cuda/tessera bench --geometry llada-8b --device cuda \
        --prompt-len 1024 --gen-length 512 --block-length 32 --steps 512 --cache dual \
        --compare block-length=512,cache=none,window=on --json-out "$OUT/window_cudnn$c.json" 2>&1 || rc=$?
      python3 -c 'import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["option"], r["seconds"], "s; cuDNN graphs built", r.get("attention_library_plans"),
          "; step graphs recorded", r.get("step_graph_captures"), "replayed", r.get("step_graph_replays"))' \
        "$OUT/window_cudnn$c.json" || true
    done
    exit "$rc"
    ;;
  window)
    prepare
    run_bench window "${WINDOW_TIMEOUT:-570}" --prompt-len 1024 --gen-length 512 --block-length 512 --steps 512 \
      --compare block-length=32,cache=dual --compare window=on --compare window-refresh=0
    ;;
  memory)
    prepare
    run_memory "${MEMORY_TIMEOUT:-60}"
    ;;
  libs)
    prepare
    run_libs
    ;;
  probe)
    prepare
    run_probe
    ;;
  final)
    prepare
    run_final
    ;;
  graphs)  # cuda_tests, then dual-cache steps with step graphs on and off at prompts of 1024 and 4096
    prepare
    rc=0
    run_tests "${TESTS_TIMEOUT:-120}" || rc=$?
    for len in 1024 4096; do
      for g in 1 0; do
        echo "== tessera bench llada-8b --cache dual --prompt-len $len, TESSERA_STEP_GRAPHS=$g"
        timeout 60 "${LINEBUF[@]}" env TESSERA_STEP_GRAPHS=$g ./build-cuda/tessera bench --geometry llada-8b \
          --device cuda --prompt-len $len --gen-length 256 --block-length 32 --cache dual \
          --json-out "$OUT/graphs_${len}_$g.json" 2>&1 | tee "$OUT/graphs_${len}_$g.log" || rc=$?
        python3 -c 'import json, sys; r = json.load(open(sys.argv[1]))["rows"][0]
print("step graphs: replays", r.get("step_graph_replays"), "nodes per replayed forward", r.get("step_graph_nodes"))' \
          "$OUT/graphs_${len}_$g.json" || true
      done
    done
    exit "$rc"
    ;;
  uniform)  # DiffusionGemma on the GPU: its own tests first, the benches of its forwards, every CUDA test
    prepare
    rc=0
    echo "== cuda_tests, DiffusionGemma's (timeout 90s)"
    timeout 90 "${LINEBUF[@]}" ./build-cuda/tests/cuda_tests --gtest_filter='*Uniform*:*DiffusionGemma*:*RmsNormEx*:*ttention*' \
      >"$OUT/uniform_tests.log" 2>&1 || rc=$?
    grep -E '^\[ +(OK|FAILED) +\]|Failure|Expected|Which is|relative|^\[==========\]' "$OUT/uniform_tests.log" | head -60
    for geo in diffusiongemma-mid:90 diffusiongemma-26b-a4b:0; do
      name=${geo%%:*} limit=${geo##*:}
      # FULL_TESTS=0: the DiffusionGemma and attention tests only (a rerun after a kernel change of its own)
      [ "$limit" -gt 0 ] || {
        [ "${FULL_TESTS:-1}" = 0 ] || run_tests "${TESTS_TIMEOUT:-150}" || rc=$?
        limit=${BIG_TIMEOUT:-200}
      }
      echo "== tessera bench --geometry $name --device cuda (timeout ${limit}s)"
      timeout "$limit" "${LINEBUF[@]}" ./build-cuda/tessera bench --geometry "$name" --device cuda --prompt-len 512 \
        --steps 3 --reps 2 --profile --json-out "$OUT/$name.json" 2>&1 | tee "$OUT/$name.log" || rc=$?
    done
    exit "$rc"
    ;;
  task)  # the task model on the GPU (issue #35): torch and the repository's tools/train only
    minutes=${2:-7}
    out=${OUT:-build-cuda/gpu_out}
    mkdir -p "$out" /tmp/task-out
    init=${TASK_INIT:-models/tessera-tiny}
    [ -f "$init/model.safetensors" ] || die "$init's weights did not travel (KEEP=$(basename "$init") stash-models)"
    # shellcheck disable=SC2086  # TASK_ARGS: words on purpose
    { nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
      PYTHONUNBUFFERED=1 timeout $((minutes * 60 + 150)) python3 tools/train/train_task.py --device cuda \
        --init "$init" --out /tmp/task-run --time-budget-minutes "$minutes" --lr 2e-3 \
        --export /tmp/task-out/tessera-task ${TASK_ARGS:-}
    } 2>&1 | tee /tmp/task-out/task_train.log || rc=$?
    cp /tmp/task-run/train_summary.json /tmp/task-out/tessera-task/ 2>/dev/null || true
    tar -C /tmp/task-out -cf "$out/task.tar" .  # one file back, whatever the export wrote
    exit "${rc:-0}"
    ;;
  *) die "usage: bash bench/gpu_session.sh pack | stash-models | restore-models | all | tests | lmax [GIB,GIB,...] | cache | sparse | des | window | window-ab | memory | libs | graphs | probe | final | uniform | task [MIN]" ;;
esac
