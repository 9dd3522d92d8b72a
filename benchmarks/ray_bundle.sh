#!/usr/bin/env bash
# A stripped Ray for the GPU machine's Python 3.12 (which has no Ray), small enough to carry:
# the ray 2.60 cp312 wheel is 79 MB; without its Java jars, RLlib / Serve / Tune / Train /
# Data / LLM parts and the dashboard's web client, with its binaries stripped, plus the
# jsonschema packages that machine lacks, it packs to about 23 MB.
#
#   bash benchmarks/ray_bundle.sh OUT.tar.xz
#   # there: tar -xJf OUT.tar.xz -C /tmp && export PYTHONPATH=/tmp/ray312:$PYTHONPATH
#
# Test it here first with the local Python 3.12 (python3.12 -s, PYTHONPATH as above, plus
# Ray's own dependencies, which the GPU machine has: click filelock msgpack packaging
# protobuf pyyaml requests).
set -euo pipefail
out="$(realpath "${1:?usage: ray_bundle.sh OUT.tar.xz}")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
pick=(--only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64
      --platform manylinux_2_17_x86_64 --no-deps -q)
pip download "${pick[@]}" ray==2.60.0 jsonschema jsonschema-specifications referencing rpds-py -d whl
mkdir ray312
for wheel in whl/*.whl; do python -m zipfile -e "$wheel" ray312/; done
cd ray312
rm -rf ray/jars ray/rllib ray/serve ray/tune ray/train ray/data ray/llm ray/dashboard/client/build
find . -name __pycache__ -prune -exec rm -rf {} +
while IFS= read -r -d '' f; do
    if file "$f" | grep -q ELF; then strip --strip-unneeded "$f" 2>/dev/null || true; fi
done < <(find . -type f \( -name '*.so' -o -path '*/core/src/ray/*' \) -print0)
# zip extraction drops the executable bit of Ray's servers
chmod +x ray/core/src/ray/gcs/gcs_server ray/core/src/ray/raylet/raylet
cd ..
tar -cJf "$out" ray312
ls -la "$out"
