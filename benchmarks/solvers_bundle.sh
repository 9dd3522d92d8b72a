#!/usr/bin/env bash
# The solvers (egglog, z3) and what importing egglog needs, for the GPU machine's Python 3.12
# (which has neither), packed to carry: searches that run there need them.
#
#   bash benchmarks/solvers_bundle.sh OUT.tar.xz [--no-z3]
#   # (--no-z3: egglog alone, 20 MB smaller; z3 only serves the cross-checking oracle)
#   # there: tar -xJf OUT.tar.xz -C /tmp/b && export PYTHONPATH=/tmp/b/solvers:$PYTHONPATH
set -euo pipefail
out="$(realpath "${1:?usage: solvers_bundle.sh OUT.tar.xz [--no-z3]}")"
z3=z3-solver
if [[ "${2:-}" == "--no-z3" ]]; then z3=""; fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
pick=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux2014_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --no-deps -q)
pip download "${pick[@]}" egglog $z3 black mypy-extensions pathspec platformdirs pytokens \
    cloudpickle graphviz opentelemetry-api importlib-metadata zipp -d whl
mkdir solvers
for wheel in whl/*.whl; do python -m zipfile -e "$wheel" solvers/; done
find solvers -name __pycache__ -prune -exec rm -rf {} +
while IFS= read -r -d '' f; do
    if file "$f" | grep -q ELF; then strip --strip-unneeded "$f" 2>/dev/null || true; fi
done < <(find solvers -type f -name '*.so*' -print0)
tar -cJf "$out" solvers
ls -la "$out"
