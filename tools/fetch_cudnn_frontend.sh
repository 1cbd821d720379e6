#!/usr/bin/env bash
# cuDNN's C++ frontend (cudnn_frontend.h and its headers: header-only, and
# published only on PyPI, inside the nvidia-cudnn-frontend wheel) into
# DIR/include, for policy::cuda's cuDNN attention. CMake looks in
# ~/.cache/difftx/cudnn-frontend (the default DIR) and in CUDNN_FRONTEND_ROOT.
# Nothing is fetched when DIR/include/cudnn_frontend.h is already there.
set -euo pipefail
dir=${1:-$HOME/.cache/difftx/cudnn-frontend}
version=1.32.0
[ -f "$dir/include/cudnn_frontend.h" ] && exit 0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The headers are the same in every wheel of a version: take the one for CPython 3.11 on x86-64.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
  --platform manylinux_2_28_x86_64 -d "$tmp" "nvidia-cudnn-frontend==$version"
python3 -m zipfile -e "$tmp"/nvidia_cudnn_frontend-*.whl "$tmp/wheel"
mkdir -p "$dir"
cp -r "$tmp/wheel/include" "$dir/include.new"
rm -rf "$dir/include" && mv "$dir/include.new" "$dir/include"  # whole or not at all
echo "cuDNN frontend $version headers in $dir/include"
