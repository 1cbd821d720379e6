#!/usr/bin/env bash
# The GPU checks' binaries, built on this machine (no GPU needed) and packed
# for a lent GPU machine, whose minutes are too few to spend compiling there.
#
#   tools/gpu_pack.sh            here: build and pack into .gpubin/ (git-ignored)
#   tools/gpu_pack.sh --unpack   there, from the repository root: lay them out
#   tools/gpu_pack.sh --build-dir  the folder to give tools/gpu_check.sh
#
# A call on the GPU machine then reads, with carry [".gpubin"]:
#   tools/gpu_pack.sh --unpack && tools/gpu_check.sh "$(tools/gpu_pack.sh --build-dir)" /tmp/logs tests bench
#
# Packed: cuda_test, nccl_test, cli_test, the difftx tool and difftx_cuda_bench,
# stripped, in one gzipped tar (.gpubin/pack.tgz, about 28 MB: oneDNN's library
# alone is 38 MB unpacked, and a call carries at most 64 MiB), built in build/gpu-pack for sm_90a (the H100 and
# H200) against the cuDNN frontend, with -march=$DIFFTX_PACK_MARCH (default
# x86-64-v3: AVX2 and FMA, which any recent x86-64 server has; -march=native
# would be this machine's CPU, not the GPU machine's), cli_test without the
# sanitizers (the device's checks are compute-sanitizer's), and the shared libraries
# they need that are neither glibc's nor CUDA's (OpenMP, Google Benchmark,
# SentencePiece; tools/gpu_check.sh loads them from BUILD/lib). The tests find
# their data and the tool by the absolute paths they were built with; --unpack
# makes those paths exist on the GPU machine.
#
# Also packed where this machine has the GPU machine's Python (3.12, with
# nanobind and scikit-build-core; DIFFTX_PACK_PYTHON, default python3.12): the
# PyTorch extension built with CUDA, as a wheel (nanobind's, so no PyTorch ABI
# to match). --unpack installs it into BUILD/python, which tools/gpu_check.sh
# puts on PYTHONPATH, so its tests step runs python/tests/test_cuda.py.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
pack=$repo/.gpubin
build=$repo/build/gpu-pack
# target:binary, the binary's path in the build folder
packed=(cuda_test:tests/cuda_test nccl_test:tests/nccl_test cli_test:tests/cli_test difftx_cli:tools/difftx
        difftx_cuda_bench:benchmarks/difftx_cuda_bench)

case ${1:-} in
  --build-dir)  # the build folder the packed binaries were built in, as they see it
    cat "$pack/build_dir"
    ;;
  --unpack)
    [ -f "$pack/build_dir" ] || { echo "gpu_pack: no $pack/build_dir (run tools/gpu_pack.sh here and carry .gpubin)" >&2; exit 2; }
    source_dir=$(cat "$pack/source_dir")
    if [ "$source_dir" != "$repo" ]; then  # the compiled-in source folder is this checkout
      [ -e "$source_dir" ] && [ ! -L "$source_dir" ] && {
        echo "gpu_pack: $source_dir exists and is not this checkout; unpack cannot place the binaries" >&2; exit 2; }
      mkdir -p "$(dirname "$source_dir")"
      ln -sfn "$repo" "$source_dir"
    fi
    target=$(cat "$pack/build_dir")
    mkdir -p "$target"
    tar xzf "$pack/pack.tgz" -C "$target"  # the binaries at their build paths, and lib/ (on LD_LIBRARY_PATH in tools/gpu_check.sh)
    echo "gpu_pack: binaries in $target"
    for wheel in "$pack"/difftx-*.whl; do
      [ -f "$wheel" ] || continue
      python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$target/python" "$wheel" &&
        echo "gpu_pack: the PyTorch extension in $target/python"
    done
    ;;
  "")
    command -v nvcc >/dev/null || { echo "gpu_pack: needs nvcc (CUDA) on this machine" >&2; exit 2; }
    "$repo/tools/fetch_cudnn_frontend.sh"
    march=${DIFFTX_PACK_MARCH:-x86-64-v3}
    CUDAARCHS=90a cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDIFFTX_NATIVE=OFF \
      -DCMAKE_CXX_FLAGS="-march=$march" -DDIFFTX_CUDA=ON \
      -DDIFFTX_TEST_SANITIZERS=OFF
    grep -q "^DIFFTX_CUDNN_FRONTEND_INCLUDE_DIR:PATH=.*include$" "$build/CMakeCache.txt" || {
      echo "gpu_pack: CMake found no cuDNN frontend; the packed binaries would lack the cuDNN attention" >&2; exit 1; }
    cmake --build "$build" --target "${packed[@]%%:*}"
    stage=$build/pack-stage  # laid out as the build folder: the binaries at their paths, lib/
    rm -rf "$pack" "$stage" && mkdir -p "$pack" "$stage/lib"
    binaries=()
    for entry in "${packed[@]}"; do
      path=${entry#*:}
      mkdir -p "$stage/$(dirname "$path")"
      strip -o "$stage/$path" "$build/$path"
      binaries+=("$build/$path")
    done
    # Shared libraries outside glibc, the C++ runtime and CUDA (the GPU machine has those).
    ldd "${binaries[@]}" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
      case $(basename "$lib") in
        libc.so* | libm.so* | libdl.so* | librt.so* | libpthread.so* | ld-linux* | libstdc++.so* | libgcc_s.so*) ;;
        libcud* | libcublas* | libnccl* | libnvrtc* | libnvJitLink*) ;;
        *) cp -L "$lib" "$stage/lib/" ;;
      esac
    done
    tar czf "$pack/pack.tgz" -C "$stage" .
    python=${DIFFTX_PACK_PYTHON:-python3.12}
    if "$python" -c "import nanobind, scikit_build_core" 2>/dev/null; then
      CUDAARCHS=90a CMAKE_ARGS="-DDIFFTX_CUDA=ON -DDIFFTX_NATIVE=OFF -DCMAKE_CXX_FLAGS=-march=$march" \
        "$python" -m pip wheel -q --no-deps --no-build-isolation -w "$pack" "$repo/python"
    else
      echo "gpu_pack: no $python with nanobind and scikit-build-core here: the PyTorch extension is not packed"
    fi
    echo "$repo" >"$pack/source_dir"
    echo "$build" >"$pack/build_dir"
    echo "gpu_pack: $(du -sh "$pack" | cut -f1) in .gpubin (march $march; libraries: $(ls "$stage/lib" | tr '\n' ' '))"
    ;;
  *)
    echo "usage: tools/gpu_pack.sh [--unpack | --build-dir]" >&2
    exit 2
    ;;
esac
