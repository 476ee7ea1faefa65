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
#    from GitHub in /content), through its own first cell. Outputs are not compared. Two at a
#    time, the slowest first (NOTEBOOKS_FIRST), so that the last one to start is a short one.
# 4. The unit tests, in the copy, with Colab's libtpu as the TPU compiler: what jax 0.7.2 and
#    libtpu 0.0.21.1 can answer differently from the pin. Kept: the kernels in interpret mode
#    (forward, backward, bounded max, routing, sliding, traversal: Pallas's interpreters differ by
#    release), lowering (jax.export's Mosaic), the VMEM and SMEM estimate-vs-compiler checks of
#    test_vmem and test_smem (each libtpu release held to its own verdicts), cores, multichip,
#    precision, in-model jit and grad, environment, notebook setup, plots (Colab's matplotlib),
#    the explorer (Colab's ipywidgets), and every new test file unless it is listed below.
#    Runs under the TPU interpreter (`pltpu.InterpretParams`, marked `tpu_interpreter`) are skipped
#    here (SVG_LIB_REPLICA=1): a Colab reader never runs that interpreter (on a TPU the kernels compile);
#    the plain interpreter's runs of the same tests stay. So are tests marked `not_on_colab`: what only
#    a chip or topology Colab does not offer exercises (a v4, a v5p, a v7x's two devices, several
#    chips; tests/conftest.py). Left to the pinned stage (PINNED_ONLY),
#    where the jax version cannot change the answer or the replica proves it another way:
#      test_browser.py   JupyterLab and Chromium: not part of Colab's runtime;
#      test_compiler.py  every method at the case study's size, twice: step 5 compiles what only
#                        Colab's libtpu can prove; each such compile takes one to four minutes of a
#                        core through jax 0.7.2;
#      test_cost.py      the static profile's cycles, recorded with the pinned libtpu only;
#      test_step_profile.py  a whole jax.grad under the static profile: the pinned libtpu's profiler
#                        (Colab's libtpu 0.0.21.1 exits without a profile there);
#      test_masks.py, test_planner.py  masks, pair counts and schedule tables in numpy; the jax
#                        side of a mask (its kernel predicate) runs inside the kernel tests, which
#                        compare every masked kernel with float64 here;
#      test_layers.py    import-linter on the source text;
#      test_execute_notebooks.py  the notebook runner's --expect: step 3 runs it here with Colab's
#                        nbclient;
#      the properties of code the notebooks run here in step 3 (where a jax 0.7.2 that lacked an
#      API or broke a kernel would fail the notebook): test_bench.py (the timing harness of 04-06),
#      test_synthetic.py (the planted heads the notebooks build), test_exercises.py (the checkers,
#      run by the solutions E1-E8), test_tuner.py (05's tuner; Colab's libtpu verdicts are
#      test_vmem's here), test_semantic_plan.py, test_semantic_quality.py, test_semantic_router.py
#      (12's planner, tables and router; test_semantic.py, the public API exact and differentiable,
#      stays), test_radial.py, test_pooled.py (masks and plans test_frontier.py runs here end to end);
#      test_knobs.py, test_yourcode_cells_*.py (the spine notebooks run again by papermill at other tile
#      sizes and with their your-code cells swapped; step 3 runs each as shipped here);
#      test_cli.py (the commands' flags, files and refusals; the work behind them is the library's,
#      tested here in its own files), test_measurements.py (the committed TPU records against the
#      code's rules, on the host), test_run_notebook_cells.py (a tool for a TPU machine).
# 5. Colab's libtpu compiles B3 at the case study's size (the blog preset: 75,600 tokens,
#    3328 x 1536 tiles) for a v5e (Colab's free tier), in the background from the start of
#    step 3 (173 s of a core, 2026-12-04): the series' headline kernel, its schedule tables in
#    SMEM and its VMEM at the blog's tiles, with the compiler a Colab reader has. For a v6e (the
#    blog's chip) notebook 09 compiles the same kernel at the same tiles, five heads of 75,600
#    tokens per chip of a v6e:2x4 layer (--expect below fails the run unless it printed its
#    compile time; the cell itself goes on if the compile fails, for a reader whose libtpu and jax
#    disagree). Every other method is compiled at this size by the pinned stage (test_compiler.py),
#    and with Colab's libtpu here at smaller tiles (test_vmem's points, test_in_model, test_smem),
#    which compile in seconds.
# 6. pip freeze before and after: the run fails if anything the runtime had was changed.
#
# `tools/test-colab.sh --setup` does step 1 only (make test runs it beside the pinned stage).
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
PACKAGES="jax jaxlib libtpu numpy scipy matplotlib ipywidgets tqdm ipython ipykernel nbformat nbclient pytest pillow"
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
# `make test` runs step 1 alone (--setup) beside the pinned stage: installing is mostly waiting
# on downloads and the disk, while the tests keep both cores busy.
[ "${1:-}" = --setup ] && exit 0
echo "make test-colab: Colab's TPU runtime replicated on $("$PY" -V) (Colab: Python 3.13):" \
     "$(cd /tmp && "$PY" -c 'import jax, jaxlib, numpy; from importlib.metadata import version as v; print("jax", jax.__version__ + ", jaxlib", jaxlib.__version__ + ", libtpu", v("libtpu") + ", numpy", numpy.__version__)')"
"$PY" -m pip freeze --all > "$WORK/freeze-before.txt"

rm -rf "$CLONE"
mkdir -p "$CLONE"
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
  [ -e "$f" ] && printf '%s\0' "$f"
done | tar --null -T - -cf - | tar -xf - -C "$CLONE"

# The slowest notebooks start first (seconds in this replica, two at a time on the 2-core machine
# under other load, fa3d977); the rest follow in name order.
NOTEBOOKS_FIRST="09_scaling_out 11_training_with_sparse_attention 10_sliding_tiles 06_b3_tile_aligned
  04_b2_full_edge_tiles 07_temporal_heads_permutation 12_semantic_tiles 05_block_size_tuning 08_svg_routing"  # 505, 146, 115, 98, 90, 85, 77, 74 s (12 timed with the frontier, now 13_which_mask_wins: a short one, in name order)
notebooks=()
for name in $NOTEBOOKS_FIRST; do
  [ -f "$CLONE/notebooks/$name.ipynb" ] && notebooks+=("svg-tpu/notebooks/$name.ipynb")
done
for path in "$CLONE"/notebooks/[0-9]*.ipynb "$CLONE"/notebooks/A_*.ipynb "$CLONE"/notebooks/exercises/solutions/E*.ipynb; do
  path="svg-tpu/${path#"$CLONE"/}"
  case " ${notebooks[*]} " in *" $path "*) ;; *) notebooks+=("$path") ;; esac
done

# Step 5 starts first, in the background and at a lower priority (nice): the compile is about three
# minutes of one core (jax 0.7.2, libtpu 0.0.21.1; the pinned libtpu takes well under one), which
# fill the minutes where the notebooks or the unit tests leave a core idle; the run waits for it
# at the end.
logs="$(pwd)/$WORK"  # the compiles run in the copy: their logs need a path that does not depend on it
rm -f "$logs"/compile-*.log "$logs"/compile-*.status
COMPILE_TARGETS="v5e"  # v6e: notebook 09 (step 5 above)
for target in $COMPILE_TARGETS; do
  (cd "$CLONE" && nice -n 10 env -u PYTHONPATH "$PY" -m svg_lib compile --preset blog --methods b3 \
     --target "$target" > "$logs/compile-$target.log" 2>&1; echo $? > "$logs/compile-$target.status") &
done

status=0
echo "make test-colab: every notebook (${#notebooks[@]}), working directory $CONTENT, through its own first cell ($(date -u +%T) UTC)"
(cd "$CONTENT" && env -u PYTHONPATH "$PY" "svg-tpu/tools/execute-notebooks.py" --check --cwd . --jobs 0 \
   --expect "09_scaling_out.ipynb= s to compile" "${notebooks[@]}") || status=1

PINNED_ONLY="test_browser test_compiler test_cost test_step_profile test_masks test_planner test_layers test_execute_notebooks
  test_bench test_synthetic test_exercises test_tuner test_semantic_plan test_semantic_quality test_semantic_router
  test_radial test_pooled test_knobs test_yourcode_cells_* test_cli test_measurements test_run_notebook_cells"  # step 4
ignore=()
set -f  # the names are globs for pytest, not for this shell
for name in $PINNED_ONLY; do ignore+=("--ignore-glob=tests/$name.py"); done
set +f
echo "make test-colab: unit tests (left to the pinned stage: $PINNED_ONLY), $(date -u +%T) UTC"
(cd "$CLONE" && env -u PYTHONPATH SVG_LIB_REQUIRE_TPU_COMPILER=1 SVG_LIB_REPLICA=1 "$PY" -m pytest -o addopts="" -ra -q \
   -n "$WORKERS" --dist loadfile --no-loadscope-reorder --durations=25 -p no:cacheprovider \
   "${ignore[@]}" ${PYTEST_ARGS:-} tests) || status=1

echo "make test-colab: waiting for Colab's libtpu to compile b3 at the case study's size for $COMPILE_TARGETS ($(date -u +%T) UTC)"
wait
for target in $COMPILE_TARGETS; do
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
