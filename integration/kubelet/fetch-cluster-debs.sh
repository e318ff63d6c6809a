#!/usr/bin/env bash
# The cluster test's Debian-packaged parts, unpacked (never installed) into the cache, and their tree's
# path printed on stdout:
#
#   etcd-server                  usr/bin/etcd (3.4; the package would start a host service if installed)
#   kubernetes-client            usr/bin/kubectl (1.20, the kubelet's version; the package collides with
#                                an existing /usr/bin/kubectl on some hosts)
#   containernetworking-plugins  usr/lib/cni/{bridge,host-local,loopback,...}
#
#   integration/kubelet/fetch-cluster-debs.sh          fetch when absent, print the tree
#   integration/kubelet/fetch-cluster-debs.sh --check  print the tree when it is there, else exit 1
#
# apt runs with a private configuration (own sources list naming bookworm with Debian's archive keyring,
# own state, lists and cache directories), like fetch-containerd.sh: the system's sources and package
# state are never read or written; each .deb is `dpkg-deb -x`ed. The tree is
# $NVINJECT_CACHE/cluster-debs/<hash>, <hash> covering the packages' versions, the mirror and this
# script's text; it is made in a temporary directory and renamed, so an interrupted run leaves no partial
# tree under the final name. Progress goes to stderr.
set -euo pipefail

# Debian 12's versions; a security update that replaces one makes `apt-get download` fail, naming it.
PACKAGES=(
    etcd-server=3.4.23-4+b4
    kubernetes-client=1.20.5+really1.20.2-1.1+deb12u1
    containernetworking-plugins=1.1.1+ds1-3+b5
)
MIRROR=${NVINJECT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=${NVINJECT_DEBIAN_SUITE:-bookworm}
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
CACHE=${NVINJECT_CACHE:-$HOME/.cache/nvinject}/cluster-debs
SELF=$(readlink -f "$0")

log() { printf 'fetch-cluster-debs: %s\n' "$*" >&2; }
die() { printf 'fetch-cluster-debs: error: %s\n' "$*" >&2; exit 1; }

hash=$({ printf '%s\n' "${PACKAGES[@]}" "mirror=$MIRROR" "suite=$SUITE"; cat "$SELF"; } | sha256sum | cut -c1-16)
OUT=$CACHE/$hash
fresh() { [[ -x $OUT/usr/bin/etcd && -x $OUT/usr/bin/kubectl && -x $OUT/usr/lib/cni/bridge && -x $OUT/usr/lib/cni/host-local ]]; }

if [[ ${1:-} == --check ]]; then
    fresh && { echo "$OUT"; exit 0; }
    exit 1
fi
[[ $# -eq 0 ]] || die "unknown argument '$1' (usage: $0 [--check])"
if fresh; then
    echo "$OUT"
    exit 0
fi
for tool in apt-get dpkg-deb sha256sum flock; do
    command -v "$tool" >/dev/null || die "'$tool' not found: install Debian's apt and dpkg (./x setup does)"
done
[[ -r $KEYRING ]] || die "$KEYRING missing: apt-get install debian-archive-keyring (./x setup does)"
mkdir -p "$CACHE"
# One fetch at a time: parallel test binaries may all ask.
exec 9>"$CACHE/.lock"
flock 9
if fresh; then
    echo "$OUT"
    exit 0
fi
start=$SECONDS
tmp=$(mktemp -d "$OUT.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
apt=$tmp/apt
mkdir -p "$apt/sources.list.d" "$apt/preferences.d" "$apt/state/lists/partial" "$apt/cache/archives/partial"
: >"$apt/state/status"
: >"$apt/preferences"
echo "deb [signed-by=$KEYRING] $MIRROR $SUITE main" >"$apt/sources.list"
apt_private() {
    apt-get -q \
        -o Dir::Etc::SourceList="$apt/sources.list" -o Dir::Etc::SourceParts="$apt/sources.list.d" \
        -o Dir::Etc::Preferences="$apt/preferences" -o Dir::Etc::PreferencesParts="$apt/preferences.d" \
        -o Dir::State="$apt/state" -o Dir::State::Lists="$apt/state/lists" \
        -o Dir::State::status="$apt/state/status" -o Dir::Cache="$apt/cache" \
        -o Dir::Cache::Archives="$apt/cache/archives" -o Debug::NoLocking=1 \
        -o APT::Get::List-Cleanup=0 -o Acquire::Retries=3 -o Acquire::Languages=none \
        -o APT::Sandbox::User=root -o APT::Architecture="$(dpkg --print-architecture)" \
        "$@"
}
log "fetching ${PACKAGES[*]} from $MIRROR $SUITE"
apt_private update >"$tmp/apt.log" 2>&1 || { tail -n 20 "$tmp/apt.log" >&2; die "apt-get update of $SUITE from $MIRROR failed (network? NVINJECT_DEBIAN_MIRROR picks another mirror)"; }
mkdir -p "$tmp/debs"
(cd "$tmp/debs" && apt_private download "${PACKAGES[@]}") >>"$tmp/apt.log" 2>&1 \
    || { tail -n 20 "$tmp/apt.log" >&2; die "apt-get download ${PACKAGES[*]} failed (a version no longer in $SUITE? update PACKAGES in $SELF)"; }
for deb in "$tmp"/debs/*.deb; do
    dpkg-deb -x "$deb" "$tmp/root"
done
rm -rf "$tmp/root/usr/share/doc" "$tmp/root/usr/share/man" "$tmp/root/etc" "$tmp/root/lib/systemd"
# They must run here, or the test would fail later with a loader error.
"$tmp/root/usr/bin/etcd" --version >"$tmp/root/VERSIONS" 2>&1 || die "the unpacked etcd does not run: $(cat "$tmp/root/VERSIONS")"
"$tmp/root/usr/bin/kubectl" version --client --short >>"$tmp/root/VERSIONS" 2>&1 || die "the unpacked kubectl does not run"
mv "$tmp/root" "$OUT"
log "unpacked into $OUT in $((SECONDS - start)) s: $(tr '\n' ' ' <"$OUT/VERSIONS")"
echo "$OUT"
