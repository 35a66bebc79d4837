#!/bin/sh
# deepgemm_build.sh: builds DeepGEMM, the indexer peer, on the GPU machine
# from the sources in the peers folder, never from the repository (which
# holds none of it), for bench/indexer_peer.py.
#
# usage: bench/deepgemm_build.sh PEERS OUTDIR VERSION
#   PEERS    the folder holding deepgemm-2.6.1-src.tar.gz and
#            deepgemm.bundle (../shared/peers here; carried to the GPU
#            machine under .gpu/peers)
#   OUTDIR   where the tree is unpacked and built: OUTDIR/dg-VERSION
#   VERSION  2.6.1 (the tarball, commit 54e22612) or a tag of the bundle
#            (v2.1.1.post3: the same CUTLASS and fmt pins, so their
#            include folders come from the tarball)
# Prints the tree's path (put it on PYTHONPATH) as its last line.
#
# Built with the system compiler: Python's build configuration there names
# a g++ wrapper whose extension carries its own libstdc++, and two copies
# beside torch's crash DeepGEMM (../shared/peers/README.md).
set -eu
if [ "$#" -ne 3 ] || [ "$1" = "--help" ]; then
    echo "usage: bench/deepgemm_build.sh PEERS OUTDIR VERSION" >&2
    [ "$#" -ge 1 ] && [ "$1" = "--help" ] && exit 0
    exit 2
fi
peers=$1 out=$2 ver=$3
tree=$out/dg-$ver
mkdir -p "$out"
rm -rf "$tree" "$out/src-$ver"
mkdir -p "$out/src-$ver"
tar -xzf "$peers/deepgemm-2.6.1-src.tar.gz" -C "$out/src-$ver"
src=$(dirname "$(find "$out/src-$ver" -maxdepth 2 -name setup.py | head -n 1)")
if [ "$ver" = "2.6.1" ]; then
    mv "$src" "$tree"
else
    git clone -q "$peers/deepgemm.bundle" "$tree"
    git -C "$tree" checkout -q "$ver"
    rm -rf "$tree/third-party"
    cp -a "$src/third-party" "$tree/third-party"
fi
cd "$tree"
echo "deepgemm $ver: commit $(git rev-parse --short HEAD 2>/dev/null || echo 54e22612)" >&2
ln -sf "$PWD/third-party/cutlass/include/cutlass" deep_gemm/include
ln -sf "$PWD/third-party/cutlass/include/cute" deep_gemm/include
CC=/usr/bin/gcc CXX=/usr/bin/g++ LDSHARED="/usr/bin/g++ -shared" \
    MAX_JOBS=${MAX_JOBS:-16} python3 setup.py build >build.log 2>&1 || {
    tail -n 30 build.log >&2
    exit 1
}
# Link the extension into place: 2.6.1 imports deep_gemm._C, the 2.1
# series deep_gemm_cpp beside the package.
for so in build/lib*/deep_gemm/_C*.so; do
    [ -e "$so" ] && ln -sf "$PWD/$so" deep_gemm/
done
for so in build/lib*/deep_gemm_cpp*.so; do
    [ -e "$so" ] && ln -sf "$PWD/$so" .
done
echo "$tree"
