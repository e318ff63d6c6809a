#!/usr/bin/env bash
# Distribution root filesystems for the ld.so.cache oracle (ldcache/tests/distro_oracle.rs):
# real Debian trees, made with mmdebstrap from the distribution's own signed archive, each a tarball
#   $NVINJECT_CACHE/rootfs/<suite>-<hash>.tar
# where <hash> covers everything that decides the tree (suite, variant, packages, mirror, this
# script's text). A tarball that is there is reused; a new one is written under a temporary name
# and renamed, so an interrupted run never leaves a partial tarball under the final name.
#
#   make-rootfs.sh [SUITE...]          make the missing ones (default: every suite below)
#   make-rootfs.sh --path SUITE        print the tarball's path (made or not); the test uses this
#   make-rootfs.sh --suites            print the suites
#
# Needs root (mmdebstrap's root mode chroots to run maintainer scripts), mmdebstrap and
# debian-archive-keyring (bookworm's carries the bullseye and trixie keys too), and network access to the mirror.
set -euo pipefail

SUITES=(bookworm trixie bullseye)
VARIANT=minbase
MIRROR="${NVINJECT_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# Libraries beyond minbase, so the trees have several library directories' worth of SONAMEs,
# development-less versioned files, and libraries that depend on each other.
packages() {
    case "$1" in
    bookworm) echo "libstdc++6,zlib1g,libssl3,libgomp1,libzstd1,libcurl4" ;;
    # The 64-bit time_t transition renamed some (libssl3t64, libcurl4t64).
    trixie) echo "libstdc++6,zlib1g,libssl3t64,libgomp1,libzstd1,libcurl4t64" ;;
    # glibc 2.31 and no merged /usr: distinct /lib and /usr/lib trees, an ldconfig that writes the
    # old+new ("compat") cache format.
    bullseye) echo "libstdc++6,zlib1g,libssl1.1,libgomp1,libzstd1,libcurl4" ;;
    *) echo "make-rootfs.sh: unknown suite '$1' (known: ${SUITES[*]})" >&2; return 2 ;;
    esac
}

CACHE="${NVINJECT_CACHE:-$HOME/.cache/nvinject}/rootfs"
SELF="$(readlink -f "$0")"

tarball() {
    local suite=$1 pkgs hash
    pkgs="$(packages "$suite")"
    hash="$({ printf 'suite=%s\nvariant=%s\npackages=%s\nmirror=%s\n' "$suite" "$VARIANT" "$pkgs" "$MIRROR"; cat "$SELF"; } |
        sha256sum | cut -c1-16)"
    echo "$CACHE/$suite-$hash.tar"
}

make_one() {
    local suite=$1 out tmp start
    out="$(tarball "$suite")"
    if [[ -s $out ]]; then
        echo "rootfs $suite: $out (cached)" >&2
        return 0
    fi
    command -v mmdebstrap >/dev/null || {
        echo "make-rootfs.sh: mmdebstrap not found: run ./x setup (or apt-get install mmdebstrap)" >&2
        return 1
    }
    [[ $(id -u) -eq 0 ]] || { echo "make-rootfs.sh: needs root (mmdebstrap's root mode)" >&2; return 1; }
    # Fail fast and clearly without network, instead of mmdebstrap's long apt retry output.
    if ! curl_ok "$MIRROR/dists/$suite/InRelease"; then
        echo "make-rootfs.sh: cannot reach $MIRROR/dists/$suite/InRelease (no network?); the $suite rootfs for the ld.so.cache oracle needs it once, then it is cached as $out (set NVINJECT_DEBIAN_MIRROR for another mirror)" >&2
        return 1
    fi
    mkdir -p "$CACHE"
    # mmdebstrap picks the format from the name's extension: a private directory holds the `.tar`.
    tmp="$(mktemp -d "$out.tmp.XXXXXX")"
    trap 'rm -rf "$tmp"' RETURN
    trap 'rm -rf "$tmp"; exit 130' INT TERM
    start=$SECONDS
    echo "rootfs $suite: building $out" >&2
    # Documentation, manuals and locales are of no use to a loader test and are half the size.
    mmdebstrap --quiet --mode=root --variant="$VARIANT" --include="$(packages "$suite")" \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
        --dpkgopt=force-unsafe-io \
        --aptopt='Acquire::Retries "3"' \
        "$suite" "$tmp/rootfs.tar" "$MIRROR"
    mv -f "$tmp/rootfs.tar" "$out"
    echo "rootfs $suite: done in $((SECONDS - start)) s ($(du -h "$out" | cut -f1))" >&2
}

# Only whether the mirror answers at all (any HTTP status): apt then reports anything else itself.
# curl may not be installed; bash's /dev/tcp serves for a plain-http mirror.
curl_ok() {
    local url=$1
    if command -v curl >/dev/null; then
        curl -sS -o /dev/null --max-time 20 "$url" 2>/dev/null
    elif [[ $url =~ ^http://([^/:]+)(:([0-9]+))?(/.*)$ ]]; then
        local host=${BASH_REMATCH[1]} port=${BASH_REMATCH[3]:-80} path=${BASH_REMATCH[4]}
        timeout 20 bash -c 'exec 3<>"/dev/tcp/$1/$2" && printf "HEAD %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" "$3" "$1" >&3 && head -c 5 <&3 | grep -q "^HTTP/"' \
            _ "$host" "$port" "$path" 2>/dev/null
    else
        return 0 # cannot check; let mmdebstrap try
    fi
}

case "${1:-}" in
--path)
    [[ $# -eq 2 ]] || { echo "usage: make-rootfs.sh --path SUITE" >&2; exit 2; }
    packages "$2" >/dev/null
    tarball "$2"
    ;;
--suites) printf '%s\n' "${SUITES[@]}" ;;
-*) sed -n '2,13p' "$SELF" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
*)
    (($#)) || set -- "${SUITES[@]}"
    for s in "$@"; do packages "$s" >/dev/null; done
    # In parallel: each is mostly waiting on the mirror and on dpkg.
    pids=()
    for s in "$@"; do make_one "$s" & pids+=($!); done
    failed=0
    for p in "${pids[@]}"; do wait "$p" || failed=1; done
    exit "$failed"
    ;;
esac
