"""Notebook 00's your-code cell, the first pallas_call (scaled_add): the checker names typical mistakes,
the solution passes, and the notebook runs with a wrong and with a correct piece in the cell."""
import functools

import jax
import pytest
from jax.experimental import pallas as pl

from svg_lib.teaching.exercises import p00_pallas_call as p00
from yourcode_runner import run_with_pieces

NOTEBOOK = "00_setup_and_tpu_primer.ipynb"


def _scaled_add(grid=None, index_map=None, block_shape=None, body=None):
    """A learner's scaled_add with one part swapped for a typical mistake."""
    def fn(x, y, *, alpha, block, interpret):
        def kernel(x_ref, y_ref, o_ref):
            o_ref[...] = (body or (lambda a, b: alpha * a + b))(x_ref[...], y_ref[...])

        g = grid(x.shape, block) if grid else (pl.cdiv(x.shape[0], block[0]), pl.cdiv(x.shape[1], block[1]))
        spec = pl.BlockSpec(block_shape(x.shape, block) if block_shape else block,
                            index_map(block) if index_map else (lambda i, j: (i, j)))
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=g,
                              in_specs=[spec, spec], out_specs=spec, interpret=interpret)(x, y)
    return fn


MISTAKES = {
    "element offsets": (_scaled_add(index_map=lambda b: (lambda i, j: (i * b[0], j * b[1]))),
                        "returns block (0, 128), expected (0, 1)", "the block's first element"),
    "swapped axes": (_scaled_add(index_map=lambda b: (lambda i, j: (j, i))), "returns block (1, 0)", "swaps the axes"),
    "floor grid": (_scaled_add(grid=lambda s, b: (s[0] // b[0], s[1] // b[1])), "the grid is (1, 2), expected (1, 3)",
                   "pl.cdiv"),
    "no grid": (_scaled_add(grid=lambda s, b: ()), "missing 2 required positional arguments",
                "did you forget grid="),
    "whole-array block": (_scaled_add(block_shape=lambda s, b: s), "block shape is (24, 256), expected (8, 128)",
                          "the array's shape"),
    "body scales y": (_scaled_add(body=lambda a, b: a + 2 * b), "element (0, 0): expected", "alpha * y + x"),
}


@pytest.mark.parametrize("name", MISTAKES)
def test_checker_names_the_mistake(name, capsys):
    fn, detail, hint = MISTAKES[name]
    result = p00.check_scaled_add(fn)
    assert not result.passed
    assert detail in result.message and hint in result.message, result.message


def test_stub_and_solution():
    def stub(x, y, *, alpha, block, interpret):
        raise NotImplementedError("your code here")

    assert "still the stub" in p00.check_scaled_add(stub).message
    namespace = {"functools": functools, "jax": jax, "pl": pl}
    exec(p00.SOLUTION, namespace)
    assert p00.check_scaled_add(namespace["scaled_add"]).passed
    assert p00.check_scaled_add(p00.scaled_add).passed
    assert len(p00.HINTS.all()) >= 4 and "pallas_call" in p00.HINTS.all()[-1]


WRONG = '''
@functools.partial(jax.jit, static_argnames=("alpha", "block", "interpret"))
def scaled_add(x, y, *, alpha, block, interpret):
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = alpha * x_ref[...] + y_ref[...]
    spec = pl.BlockSpec(block, lambda i, j: (i * block[0], j * block[1]))  # element offsets
    grid = (pl.cdiv(x.shape[0], block[0]), pl.cdiv(x.shape[1], block[1]))
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=grid,
                          in_specs=[spec, spec], out_specs=spec, interpret=interpret)(x, y)
'''

COUNTED = '''
SHAPES = []  # (shape, block) of every trace of the piece: who called it, and at what size


@functools.partial(jax.jit, static_argnames=("alpha", "block", "interpret"))
def scaled_add(x, y, *, alpha, block, interpret):
    SHAPES.append((x.shape, block))
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = alpha * x_ref[...] + y_ref[...]
    spec = pl.BlockSpec(block, lambda i, j: (i, j))
    grid = (pl.cdiv(x.shape[0], block[0]), pl.cdiv(x.shape[1], block[1]))
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=grid,
                          in_specs=[spec, spec], out_specs=spec, interpret=interpret)(x, y)
'''


def test_notebook_with_a_wrong_piece_says_not_yet():
    texts = run_with_pieces(NOTEBOOK, {0: WRONG}, stop_after=1)["outputs"]
    verdict = texts[-1]
    assert "not yet" in verdict and "the block's first element" in verdict
    assert "The cells below run svg_lib's scaled_add" in verdict


def test_notebook_runs_the_learners_piece():
    run = run_with_pieces(NOTEBOOK, {0: COUNTED}, probe="print(sorted(set(SHAPES)))")
    assert any("The cells below run your scaled_add" in t for t in run["outputs"])
    # the cells after the check call the piece at sizes the checker never uses: the demo, the ragged 300 columns
    assert "((64, 512), (16, 256))" in run["probe"] and "((8, 300), (8, 100))" in run["probe"], run["probe"]


def test_svg_libs_piece_compiles_for_a_tpu(tpu_compiler):
    """svg_lib's scaled_add (what the notebook runs until the learner's passes) compiles for a v6e."""
    kernel = functools.partial(p00.scaled_add, alpha=0.5, block=(16, 256), interpret=False)
    compiled, _ = tpu_compiler.compile_fn(kernel, [((64, 512), "float32")] * 2, target="v6e")
    assert compiled is not None
