#!/usr/bin/env bash
# make test-colab: the series on a replica of Colab's TPU runtime, as a Colab reader meets it.
#
# 1. .venv-colab holds the packages of tools/colab-tpu-runtime.txt that the series imports or needs
#    to run notebooks, at exactly Colab's versions (jax 0.7.2, libtpu 0.0.21.1, numpy 2.1.3, ...),
#    plus the test tools Colab lacks (nbval, hypothesis), added without their dependencies. svg_lib
#    itself is not installed: each notebook's first cell has to find it, as on Colab.
# 2. The repository is copied to .colab/content/svg-tpu (this checkout's tracked and untracked,
#    not ignored, files), as the README's Colab steps clone it into /content/svg-tpu.
# 3. Every notebook (numbered, appendix, exercise solutions) runs top to bottom with its kernel's
#    working directory in .colab/content, outside notebooks/ (Colab starts a notebook opened
#    from GitHub in /content), through its own first cell. Outputs are not compared.
# 4. The unit tests, in the copy, with Colab's libtpu as the TPU compiler (the estimate-vs-compiler
#    checks of test_vmem and test_smem included: they hold each libtpu release to its own verdicts),
#    except the two files that compile at the case study's size many times over (test_compiler.py,
#    test_cost.py): there each blog-size compile takes a minute or two of a core with either jax.
# 5. Colab's libtpu compiles dense, b2 and b3 at the case study's size (the blog preset: 75,600
#    tokens, 3328 x 1536 tiles) for a v5e and a v6e, one process per target.
# 6. pip freeze before and after: the run fails if anything the runtime had was changed.
#
# Colab runs Python 3.13; this replica uses $PYTHON (3.11 here), and says so.
set -euo pipefail
export PYDEVD_DISABLE_FILE_VALIDATION=1  # ipykernel 6.17 warns about frozen modules in every kernel otherwise
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=.venv-colab
WORK=.colab
CONTENT=$WORK/content
CLONE=$CONTENT/svg-tpu
PACKAGES="jax jaxlib libtpu numpy scipy matplotlib ipywidgets ipython ipykernel nbformat nbclient pytest pillow"
TOOLS="nbval coverage hypothesis sortedcontainers pytest-xdist execnet"
WORKERS=${PYTEST_WORKERS:-auto}
PY="$(pwd)/$VENV/bin/python"

mkdir -p "$WORK"
# Colab's versions as pip constraints: every `name==version` line (lines pinned to a URL are left out)
grep -E '^[A-Za-z0-9_.-]+==[^ ]+$' tools/colab-tpu-runtime.txt > "$WORK/constraints.txt"
stamp="$VENV/.installed-$(cat tools/colab-tpu-runtime.txt tools/test-colab.sh | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q -c "$WORK/constraints.txt" $PACKAGES
  "$VENV/bin/python" -m pip freeze --all > "$WORK/runtime-freeze.txt"
  "$VENV/bin/python" -m pip install -q --no-deps $TOOLS
  touch "$stamp"
fi
echo "make test-colab: Colab's TPU runtime replicated on $("$PY" -V) (Colab: Python 3.13):" \
     "$(cd /tmp && "$PY" -c 'import jax, jaxlib, numpy; from importlib.metadata import version as v; print("jax", jax.__version__ + ", jaxlib", jaxlib.__version__ + ", libtpu", v("libtpu") + ", numpy", numpy.__version__)')"
"$PY" -m pip freeze --all > "$WORK/freeze-before.txt"

rm -rf "$CLONE"
mkdir -p "$CLONE"
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
  [ -e "$f" ] && printf '%s\0' "$f"
done | tar --null -T - -cf - | tar -xf - -C "$CLONE"

status=0
echo "make test-colab: every notebook, working directory $CONTENT, through its own first cell"
(cd "$CONTENT" && env -u PYTHONPATH "$PY" "svg-tpu/tools/execute-notebooks.py" --check --cwd . --jobs 0 \
   svg-tpu/notebooks/[0-9]*.ipynb svg-tpu/notebooks/A_*.ipynb svg-tpu/notebooks/exercises/solutions/E*.ipynb) || status=1

echo "make test-colab: unit tests"
(cd "$CLONE" && env -u PYTHONPATH SVG_LIB_REQUIRE_TPU_COMPILER=1 "$PY" -m pytest -o addopts="" -ra -q \
   -n "$WORKERS" --dist loadfile -p no:cacheprovider \
   --ignore=tests/test_browser.py --ignore=tests/test_compiler.py --ignore=tests/test_cost.py \
   ${PYTEST_ARGS:-} tests) || status=1

echo "make test-colab: Colab's libtpu compiles dense, b2 and b3 at the case study's size for v5e and v6e"
# one process per target, side by side: each compile is a minute or two of one core
logs="$(pwd)/$WORK"  # the compiles run in the copy: their logs need a path that does not depend on it
for target in v5e v6e; do
  (cd "$CLONE" && env -u PYTHONPATH "$PY" -m svg_lib compile --preset blog --methods dense,b2,b3 \
     --target "$target" > "$logs/compile-$target.log" 2>&1; echo $? > "$logs/compile-$target.status") &
done
wait
for target in v5e v6e; do
  cat "$logs/compile-$target.log" || true
  [ "$(cat "$logs/compile-$target.status" 2>/dev/null)" = 0 ] || {
    echo "make test-colab: compiling for $target failed" >&2; status=1; }
done

"$PY" -m pip freeze --all > "$WORK/freeze-after.txt"
if ! diff -u "$WORK/freeze-before.txt" "$WORK/freeze-after.txt"; then
  echo "make test-colab: the run changed the runtime's packages (diff above)" >&2
  status=1
fi
# the test tools were added without dependencies, so the runtime's own packages must be as installed
"$PY" - "$WORK/runtime-freeze.txt" "$WORK/freeze-after.txt" <<'PYEOF' || status=1
import sys
runtime, after = ({l.strip() for l in open(p) if l.strip()} for p in sys.argv[1:])
changed = sorted(runtime - after)
if changed:
    sys.exit("make test-colab: Colab's packages changed: " + ", ".join(changed))
print(f"make test-colab: the {len(runtime)} packages of the replica are unchanged")
PYEOF
exit $status
