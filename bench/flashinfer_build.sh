#!/bin/sh
# flashinfer_build.sh: builds bench/flashinfer_topk.cu, a C entry point to
# FlashInfer's top-k, against the headers of a FlashInfer wheel, for
# bench/indexer_peer.py --flashinfer.  Nothing of FlashInfer enters the
# repository: the headers come from the wheel at build time.
#
# usage: bench/flashinfer_build.sh WHEEL-OR-DIR OUTDIR
#   WHEEL-OR-DIR  flashinfer_python-*.whl (pip download --no-deps
#                 flashinfer-python==0.7.4), or a folder holding its
#                 flashinfer/data/include and flashinfer/data/cccl (the
#                 wheel is 101 MB, over the GPU machine's 64 MiB carry;
#                 its headers are 32 MB, 3.6 MB as a .tar.gz)
#   OUTDIR        where the headers are unpacked and libkw_fi_topk.so built
# Prints the library's path as its last line.  The kernel is header-only
# (topk.cuh and CUB), so no tvm-ffi, cuda-python or torch extension is
# needed; nvcc from /usr/local/cuda, sm_90a, about a minute.
set -eu
if [ "$#" -ne 2 ] || [ "$1" = "--help" ]; then
    echo "usage: bench/flashinfer_build.sh WHEEL-OR-DIR OUTDIR" >&2
    [ "$#" -ge 1 ] && [ "$1" = "--help" ] && exit 0
    exit 2
fi
src=$1 out=$2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
if [ -d "$src" ]; then
    hdr=$src
else
    hdr=$out/wheel
    python3 -c 'import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
z.extractall(sys.argv[2], [n for n in z.namelist()
                           if n.startswith(("flashinfer/data/include/", "flashinfer/data/cccl/"))])' \
        "$src" "$hdr"
fi
d=$hdr/flashinfer/data
[ -f "$d/include/flashinfer/topk.cuh" ] || {
    echo "flashinfer_build.sh: $d/include/flashinfer/topk.cuh: not found" >&2
    exit 1
}
${NVCC:-/usr/local/cuda/bin/nvcc} -O3 -std=c++17 -arch=sm_90a -shared -Xcompiler -fPIC \
    -I "$d/include" -I "$d/cccl/cub" -I "$d/cccl/libcudacxx/include" -I "$d/cccl/thrust" \
    "$here/flashinfer_topk.cu" -o "$out/libkw_fi_topk.so"
echo "$out/libkw_fi_topk.so"
