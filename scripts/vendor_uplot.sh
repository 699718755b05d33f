#!/usr/bin/env bash
# Vendor uPlot's single-file build (no bundler) from the npm registry: scripts/vendor_uplot.sh [VERSION]
# Then point dashboard/templates/dashboard/job.html at the new folder and delete the old one.
set -euo pipefail
version="${1:-1.6.32}"
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/dashboard/static/vendor/uplot-$version"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "uplot@$version" >/dev/null && tar xzf "uplot-$version.tgz")
mkdir -p "$dest"
cp "$work/package/dist/uPlot.iife.min.js" "$work/package/dist/uPlot.min.css" "$work/package/LICENSE" "$dest/"
printf 'uPlot %s (MIT, https://github.com/leeoniya/uPlot), from `npm pack uplot@%s`: dist/uPlot.iife.min.js, dist/uPlot.min.css, LICENSE.\nRe-vendor with scripts/vendor_uplot.sh VERSION.\n' "$version" "$version" >"$dest/README.md"
(cd "$dest" && sha256sum uPlot.iife.min.js uPlot.min.css >>README.md)
echo "vendored uPlot $version into ${dest#"$root"/}"
