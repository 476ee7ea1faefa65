"""Notebook 00's your-code piece, a first `pallas_call`: `check_scaled_add`, its hidden cases, its hints,
svg_lib's own `scaled_add` (what the notebook runs until the learner's passes) and `blocks_line`.

The learner writes `scaled_add(x, y, *, alpha, block, interpret)`: `alpha * x + y` for float32 arrays
`[rows, cols]`, one `block = (block_rows, block_cols)` per grid step. The checker traces the learner's
function to read its `pallas_call` (grid, block shapes, index maps at every grid step) and names the first
thing that differs from what the contract needs, then runs it in interpret mode against NumPy.
"""
from __future__ import annotations

import functools
import math

import jax
import numpy as np

from svg_lib.chips import TARGETS
from svg_lib.teaching.exercises.common import CheckResult, _Case, _Fail, _call, _finish, _fmt
from svg_lib.teaching.yourcode import Hints


def _kernel(x_ref, y_ref, o_ref, *, alpha):
    o_ref[...] = alpha * x_ref[...] + y_ref[...]


@functools.partial(jax.jit, static_argnames=("alpha", "block", "interpret"))
def scaled_add(x, y, *, alpha, block=(8, 128), interpret=False):
    """svg_lib's piece: alpha * x + y for x, y `[rows, cols]`, one `block` per grid step (ragged last blocks)."""
    from jax.experimental import pallas as pl

    grid = (pl.cdiv(x.shape[0], block[0]), pl.cdiv(x.shape[1], block[1]))
    spec = pl.BlockSpec(block, lambda i, j: (i, j))
    return pl.pallas_call(functools.partial(_kernel, alpha=alpha), out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          grid=grid, in_specs=[spec, spec], out_specs=spec, interpret=interpret)(x, y)


SOLUTION = '''\
@functools.partial(jax.jit, static_argnames=("alpha", "block", "interpret"))
def scaled_add(x, y, *, alpha, block, interpret):
    def kernel(x_ref, y_ref, o_ref):
        o_ref[...] = alpha * x_ref[...] + y_ref[...]

    grid = (pl.cdiv(x.shape[0], block[0]), pl.cdiv(x.shape[1], block[1]))
    spec = pl.BlockSpec(block, lambda i, j: (i, j))  # grid step (i, j) works on block (i, j)
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=grid,
                          in_specs=[spec, spec], out_specs=spec, interpret=interpret)(x, y)
'''

HINTS = Hints("scaled_add's pallas_call", (
    "The kernel body sees one block of each operand as a ref: read with x_ref[...], write with "
    "o_ref[...] = ... . It computes alpha * x + y for that block only.",
    "The grid counts blocks, one step per block: (blocks down the rows, blocks across the columns). When a "
    "block does not divide the array, the last block is ragged and still needs its step: pl.cdiv(rows, "
    "block_rows), not rows // block_rows.",
    "One BlockSpec serves x, y and the output: pl.BlockSpec(block, index_map), where index_map(i, j) returns "
    "the block's index counted in blocks, (i, j), not its first element (i * block_rows, j * block_cols).",
    "pl.pallas_call(kernel, ...) returns a function: apply it to the operands, (x, y), and return that. Its "
    "out_shape describes the output with no data: a jax.ShapeDtypeStruct shaped like x; pass interpret too.",
), SOLUTION)


def _cases() -> list[_Case]:
    specs = [((8, 128), (8, 128), 2.0, "one block covering the whole array (one grid step)"),
             ((24, 256), (8, 128), 0.5, "3 x 2 blocks of 8 x 128 (more than one grid step on each axis)"),
             ((32, 512), (16, 128), -1.5, "2 x 4 blocks of 16 x 128 (grid axes of different lengths)"),
             ((8, 300), (8, 128), 3.0, "300 columns in blocks of 128: the last block is ragged (grid (1, 3))"),
             ((20, 384), (8, 128), 0.25, "20 x 384 in blocks of 8 x 128: ragged rows too (grid (3, 3))"),
             ((48, 768), (16, 256), 1.0, "48 x 768 in blocks of 16 x 256 (grid (3, 3))")]
    return [_Case(name, dict(shape=shape, block=block, alpha=alpha)) for shape, block, alpha, name in specs]


def _pallas_calls(jaxpr) -> list:
    """Every pallas_call equation inside `jaxpr`, looking into jit and other sub-jaxprs."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            found.append(eqn)
            continue
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    found.extend(_pallas_calls(inner))
    return found


def _block_shape(mapping) -> tuple:
    return tuple(getattr(b, "block_size", b) for b in mapping.block_shape)


def _index(mapping, step) -> tuple:
    import jax.numpy as jnp

    closed = mapping.index_map_jaxpr
    out = jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *(jnp.int32(s) for s in step))
    return tuple(int(v) for v in out)


_HINTS = {"required positional argument": ("Pallas calls each index map with one argument per grid axis, and this "
                                           "call has fewer: did you forget grid=(pl.cdiv(rows, block_rows), "
                                           "pl.cdiv(cols, block_cols))?"),
          "which is not a valid JAX type": ("scaled_add returned a function: pl.pallas_call(kernel, ...) builds the "
                                            "call, which you then apply to the operands, pl.pallas_call(...)(x, y)"),
          "Mosaic": "pass interpret=interpret to pl.pallas_call: without a TPU the kernel runs in interpret mode",
          "interpret": "pass interpret=interpret to pl.pallas_call: without a TPU the kernel runs in interpret mode"}


def _inspect(fn, x, y, alpha, block):
    """Read the learner's pallas_call from its jaxpr and raise _Fail at the first thing that is off."""
    shape = x.shape
    jaxpr = _call(lambda a, b: jax.make_jaxpr(lambda u, w: fn(u, w, alpha=alpha, block=block, interpret=True))(a, b),
                  "scaled_add", x, y, hints=_HINTS)
    calls = _pallas_calls(jaxpr.jaxpr)
    if len(calls) != 1:
        raise _Fail(f"scaled_add made {len(calls)} pallas_call(s), expected exactly one",
                    "return pl.pallas_call(kernel, ...)(x, y): one call does the whole array, block by block")
    gm = calls[0].params["grid_mapping"]
    grid = tuple(int(g) for g in gm.grid)
    want = (math.ceil(shape[0] / block[0]), math.ceil(shape[1] / block[1]))
    floor = (shape[0] // block[0], shape[1] // block[1])
    if grid != want:
        where = f"for x {shape} in blocks of {block} the grid is {grid}, expected {want}"
        if grid in ((), (1,), (1, 1)):
            hint = ("without a grid the body runs once, on block (0, 0) only: grid=(pl.cdiv(rows, block_rows), "
                    "pl.cdiv(cols, block_cols)), one step per block")
        elif grid == floor:
            hint = ("the block does not divide the array here, so the last block is ragged and still needs a step: "
                    "use pl.cdiv(rows, block_rows), which rounds up, not rows // block_rows")
        elif grid == want[::-1]:
            hint = "the grid's axes are swapped: the first counts blocks down the rows, the second across the columns"
        else:
            hint = "the grid counts blocks, one step per block on each axis: (ceil(rows / block_rows), ceil(cols / block_cols))"
        raise _Fail(where, hint)
    mappings = list(gm.block_mappings)
    if len(mappings) != 3:
        raise _Fail(f"the pallas_call has {len(mappings)} block specs (inputs and outputs), expected 3: x, y and the output",
                    "in_specs=[spec, spec] for x and y, out_specs=spec for the output")
    for name, mapping in zip(("x", "y", "the output"), mappings):
        got = _block_shape(mapping)
        if got != tuple(block):
            hint = ("the block shape is the array's shape: a BlockSpec's first argument is the block, `block`"
                    if got == tuple(shape) else "the block shape's axes are swapped" if got == tuple(block)[::-1]
                    else "every operand's BlockSpec takes `block` as its block shape")
            raise _Fail(f"{name}'s block shape is {got}, expected {tuple(block)}", hint)
        for step in np.ndindex(*grid):
            index = _index(mapping, step)
            if index == tuple(step):
                continue
            i, j = step
            if index == (i * block[0], j * block[1]):
                hint = ("the index map returns the block's first element; Pallas wants the block's index, counted in "
                        "blocks: lambda i, j: (i, j)")
            elif index == (j, i):
                hint = "the index map swaps the axes: grid step (i, j) must work on block (i, j)"
            else:
                hint = "grid step (i, j) works on block (i, j) of every operand: lambda i, j: (i, j)"
            raise _Fail(f"at grid step {tuple(step)} the index map of {name} returns block {index}, expected "
                        f"{tuple(step)}", hint)


def check_scaled_add(fn, *, seed: int = 0) -> CheckResult:
    """Notebook 00: `fn(x, y, *, alpha, block, interpret)` returns alpha * x + y through one pallas_call.

    Each hidden case (float32, one to nine grid steps, ragged last blocks included) first reads the
    call's grid, block shapes and index maps from its jaxpr, then runs it with interpret=True and
    compares with NumPy.
    """
    import jax.numpy as jnp

    rng = np.random.default_rng(seed)

    def run(case):
        shape, block, alpha = case.data["shape"], case.data["block"], case.data["alpha"]
        # distinct, exactly representable values: a block read from the wrong place cannot look right
        x = (np.arange(math.prod(shape), dtype=np.float32).reshape(shape) + rng.integers(0, 4)).astype(np.float32)
        y = rng.standard_normal(shape).astype(np.float32)
        _inspect(fn, jnp.asarray(x), jnp.asarray(y), alpha, block)
        out = _call(fn, "scaled_add", jnp.asarray(x), jnp.asarray(y), alpha=alpha, block=block, interpret=True,
                    hints=_HINTS)
        got = np.asarray(out, np.float64)
        if got.shape != shape:
            raise _Fail(f"the result has shape {got.shape}, expected {shape}",
                        "out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype): the output is shaped like x")
        want = alpha * x.astype(np.float64) + y
        bad = ~np.isclose(got, want, rtol=1e-6, atol=1e-4)
        if bad.any():
            r, c = (int(v) for v in np.argwhere(bad)[0])
            swapped = alpha * y.astype(np.float64) + x
            hint = ("your body computes alpha * y + x: scale x" if np.allclose(got, swapped, rtol=1e-6, atol=1e-4)
                    else ("unwritten: some grid step never wrote this block (o_ref = ... only rebinds the name; write into "
                          "the ref, o_ref[...] = ...)") if np.isnan(got[r, c])
                    else "o_ref[...] = alpha * x_ref[...] + y_ref[...]")
            raise _Fail(f"element ({r}, {c}): expected {_fmt(want[r, c])}, got {_fmt(got[r, c])}", hint)

    return _finish("scaled_add's pallas_call", _cases(), run,
                   "grid, block shapes and index maps read from your call; one to nine grid steps, ragged last "
                   "blocks; results against NumPy")


def blocks_line(shape, block, *, operands: int = 3, itemsize: int = 4, chip: str = "v6e") -> str:
    """What a blocked elementwise call costs in steps and VMEM: grid steps, bytes of one step's blocks,
    and the VMEM Pallas reserves for them (two buffers per operand, so the next step's DMA overlaps this
    step's compute) against `chip`'s default scoped VMEM."""
    grid = (math.ceil(shape[0] / block[0]), math.ceil(shape[1] / block[1]))
    one = block[0] * block[1] * itemsize
    reserved = 2 * operands * one
    scoped = TARGETS[chip].default_scoped_vmem
    return (f"grid {grid} = {grid[0] * grid[1]} steps; a block {block[0]} x {block[1]} x {itemsize} B = "
            f"{one / 1024:g} KiB; {operands} operands double-buffered: {reserved / 1024:g} KiB of {chip}'s "
            f"{scoped / 2**20:.0f} MiB scoped VMEM ({reserved / scoped:.2%})")
