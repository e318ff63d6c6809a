#!/usr/bin/env bash
# Newer containerd builds for the integration suites, from Debian's own signed archive, run on Debian
# 12 as they are (they need only libc6 >= 2.34): trixie's 1.7 and sid's 2.1. Debian 12's own
# containerd (1.6) is the system package; runc stays Debian 12's (sid's needs a newer glibc).
#
# Each build is unpacked under
#   $NVINJECT_CACHE/containerd/<version>-<hash>/usr/bin/{containerd,containerd-shim-runc-v2,ctr}
# where <hash> covers everything that decides the tree (suite, package version, mirror, this script's
# text). A tree that is there is reused; a new one is made in a temporary directory and renamed, so an
# interrupted run never leaves a partial tree under the final name.
#
# apt runs with a private configuration (own sources list naming the suite with Debian's archive
# keyring, own state/lists/cache directories): the system's sources and package state are never read
# or written.
#
#   fetch-containerd.sh [VERSION...]   fetch the missing ones (default: every version below)
#   fetch-containerd.sh --path VERSION print the tree's path (made or not); the harness uses this
#   fetch-containerd.sh --versions     print the versions
set -euo pipefail

VERSIONS=(1.7 2.1)
MIRROR="${NVINJECT_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg

# version -> "suite package-version"
build_of() {
    case "$1" in
    1.7) echo "trixie 1.7.24~ds1-6+deb13u1" ;;
    2.1) echo "sid 2.1.9+ds1-5" ;;
    *) echo "fetch-containerd.sh: unknown version '$1' (known: ${VERSIONS[*]})" >&2; return 2 ;;
    esac
}

CACHE="${NVINJECT_CACHE:-$HOME/.cache/nvinject}/containerd"
SELF="$(readlink -f "$0")"

tree() {
    local version=$1 build hash
    build="$(build_of "$version")"
    hash="$({ printf 'version=%s\nbuild=%s\nmirror=%s\n' "$version" "$build" "$MIRROR"; cat "$SELF"; } |
        sha256sum | cut -c1-16)"
    echo "$CACHE/$version-$hash"
}

# apt-get with everything private under $1 (the configuration directory).
apt_private() {
    local dir=$1
    shift
    apt-get -q \
        -o Dir::Etc::SourceList="$dir/sources.list" -o Dir::Etc::SourceParts="$dir/sources.list.d" \
        -o Dir::Etc::Preferences="$dir/preferences" -o Dir::Etc::PreferencesParts="$dir/preferences.d" \
        -o Dir::State="$dir/state" -o Dir::State::Lists="$dir/state/lists" \
        -o Dir::State::status="$dir/state/status" -o Dir::Cache="$dir/cache" \
        -o Dir::Cache::Archives="$dir/cache/archives" -o Debug::NoLocking=1 \
        -o APT::Get::List-Cleanup=0 -o Acquire::Retries=3 -o Acquire::Languages=none \
        -o APT::Architecture="$(dpkg --print-architecture)" \
        "$@"
}

make_one() {
    local version=$1 out suite pkgver tmp start
    out="$(tree "$version")"
    if [[ -x $out/usr/bin/containerd ]]; then
        echo "containerd $version: $out (cached)" >&2
        return 0
    fi
    read -r suite pkgver <<<"$(build_of "$version")"
    [[ -r $KEYRING ]] || {
        echo "fetch-containerd.sh: $KEYRING missing: apt-get install debian-archive-keyring (./x setup does)" >&2
        return 1
    }
    mkdir -p "$CACHE"
    tmp="$(mktemp -d "$out.tmp.XXXXXX")"
    trap 'rm -rf "$tmp"' RETURN
    start=$SECONDS
    local apt="$tmp/apt"
    mkdir -p "$apt/sources.list.d" "$apt/preferences.d" "$apt/state/lists/partial" "$apt/cache/archives/partial"
    : >"$apt/state/status"
    : >"$apt/preferences"
    echo "deb [signed-by=$KEYRING] $MIRROR $suite main" >"$apt/sources.list"
    echo "containerd $version: fetching $suite's containerd $pkgver from $MIRROR" >&2
    if ! apt_private "$apt" update >"$tmp/apt.log" 2>&1; then
        echo "fetch-containerd.sh: apt-get update of $suite from $MIRROR failed (no network? set NVINJECT_DEBIAN_MIRROR for another mirror):" >&2
        tail -n 20 "$tmp/apt.log" >&2
        return 1
    fi
    if ! (cd "$tmp" && apt_private "$apt" download "containerd=$pkgver") >>"$tmp/apt.log" 2>&1; then
        echo "fetch-containerd.sh: apt-get download containerd=$pkgver from $suite failed (is that version still in $suite? update build_of in $SELF):" >&2
        tail -n 20 "$tmp/apt.log" >&2
        return 1
    fi
    dpkg-deb -x "$tmp"/containerd_*.deb "$tmp/root"
    for bin in containerd containerd-shim-runc-v2 ctr; do
        [[ -x $tmp/root/usr/bin/$bin ]] || { echo "fetch-containerd.sh: $pkgver has no usr/bin/$bin" >&2; return 1; }
    done
    # It must run here (the glibc it needs), or the suites would fail later with a loader error.
    if ! "$tmp/root/usr/bin/containerd" --version >"$tmp/root/VERSION" 2>"$tmp/run.log"; then
        echo "fetch-containerd.sh: $suite's containerd does not run on this system: $(cat "$tmp/run.log")" >&2
        return 1
    fi
    rm -rf "$tmp/root/usr/share/doc" "$tmp/root/usr/share/man"
    mv "$tmp/root" "$out"
    echo "containerd $version: $(cat "$out/VERSION") in $out, $((SECONDS - start)) s" >&2
}

case "${1:-}" in
--path)
    [[ $# -eq 2 ]] || { echo "usage: fetch-containerd.sh --path VERSION" >&2; exit 2; }
    build_of "$2" >/dev/null
    tree "$2"
    ;;
--versions) printf '%s\n' "${VERSIONS[@]}" ;;
-*) sed -n '2,18p' "$SELF" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
*)
    (($#)) || set -- "${VERSIONS[@]}"
    for v in "$@"; do build_of "$v" >/dev/null; done
    pids=()
    for v in "$@"; do make_one "$v" & pids+=($!); done
    failed=0
    for p in "${pids[@]}"; do wait "$p" || failed=1; done
    exit "$failed"
    ;;
esac
