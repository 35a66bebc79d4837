#!/bin/sh
# check_unreachable_build.sh BUILD: the suites that run kwarmd as another
# user pass when that user cannot reach the build tree, as in root's clone
# inside its 0700 home on a fresh Debian machine (issue 24).
#
# In a private mount namespace the build directory is covered by a tmpfs
# of mode 0700 into which each of its entries is bind-mounted back: root
# (these suites) finds every path where it was, `nobody` cannot traverse
# the directory at all.  Exit 77 (skipped) when not root, or when there is
# no unshare, mount namespace or user nobody.
set -eu
build=$(cd "$1" && pwd)
if [ "$(id -u)" != 0 ]; then
    echo "skipped: not root (the suites run kwarmd as nobody only as root)"
    exit 77
fi
if ! command -v unshare >/dev/null || ! getent passwd nobody >/dev/null ||
   ! unshare -m true 2>/dev/null; then
    echo "skipped: needs unshare -m (a mount namespace) and a user nobody"
    exit 77
fi
exec unshare -m sh -eu -c '
build=$1
mount --make-rprivate /
stash=$(mktemp -d /tmp/kw-unreachable.XXXXXX)
mount --bind "$build" "$stash"
mount -t tmpfs -o mode=0700 kw-0700 "$build"
for e in "$stash"/* "$stash"/.[!.]*; do
    [ -e "$e" ] || continue
    n=${e##*/}
    if [ -d "$e" ]; then mkdir "$build/$n"; else : >"$build/$n"; fi
    mount --bind "$e" "$build/$n"
done
if runuser -u nobody -- test -x "$build/kwarmd"; then
    echo "FAIL: nobody still reaches $build/kwarmd; the check proves nothing"
    exit 1
fi
echo "$build is mode 0700 here: nobody cannot reach kwarmd in it"
cd "$build"
./test_daemon_readonly --jobs 1 --filter "daemon_readonly/a_cache_it_cannot_write*"
./test_daemon_hostile --jobs 1 --filter "hostile/a_socket_directory*"
' sh "$build"
