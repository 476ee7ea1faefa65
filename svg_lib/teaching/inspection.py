"""Looking inside the kernels without a TPU: excerpts of their source, and what their tile bodies trace to.

Two helpers that let a notebook show a kernel instead of describing it:

    from svg_lib.teaching.inspection import source_lines, tile_bodies, tile_body_table

    print(source_lines(grid.tile_step_call, "def kernel(", "run_step(step, lambda"))
    bodies = {m: tile_bodies(mask, m) for m in ("b1", "b2")}   # one TileBody per tile body a kernel holds
    print(tile_body_table(bodies))

`tile_bodies` traces a method's kernel with `jax.make_jaxpr` (no TPU, nothing runs), finds
each tile body in it (the loop over key chunks inside `kernels.online_softmax_tile`, or
Splash's equivalent loop) and keeps, in trace order, the primitives that read or write a
whole `[block_q, block_kv_compute]` tile of scores: the work done once per (query, key) pair.

What such a list is, and is not: it counts the operations the kernel *asks for*, before the
TPU compiler fuses them, schedules them and assigns them to units. It is not a count of
cycles, and not all of it is vector-unit (VPU) arithmetic: `dot_general` runs on the MXU, and
`exp` on a TPU goes to the EUP, the transcendental unit beside the VPU. What a body costs
on a TPU is what the compiler's static profile simulates (`svg_lib.instruments.tpu.cost`).
"""
from __future__ import annotations

import inspect
import textwrap
from dataclasses import dataclass

from svg_lib.attention import build_attention

_LANES = 128  # the kernels' running max and sum are [block_q, 128]: a scores tile must differ in shape
_WRAPPERS = ("jit", "pjit")  # nested-call primitives: their insides are walked, they are not work themselves


def source_lines(fn, first: str, last: str) -> str:
    """The lines of `fn`'s source from the first one containing `first` to the next one containing `last`.

    Both ends are included, with their indentation. Raises ValueError naming what was not found.
    """
    lines = inspect.getsource(fn).splitlines()
    start = next((n for n, line in enumerate(lines) if first in line), None)
    if start is None:
        raise ValueError(f"no line of {fn.__qualname__} contains {first!r}")
    stop = next((n for n in range(start, len(lines)) if last in lines[n]), None)
    if stop is None:
        raise ValueError(f"no line of {fn.__qualname__} at or after {first!r} contains {last!r}")
    return "\n".join(lines[start:stop + 1])


@dataclass(frozen=True)
class TileBody:
    """One tile body of a traced kernel: `ops`, the primitive names that touch a whole tile of
    scores `[block_q, block_kv_compute]`, in trace order."""

    ops: tuple[str, ...]

    @property
    def masked(self) -> bool:
        """Whether the body selects between scores and MASK_VALUE (an elementwise mask)."""
        return "select_n" in self.ops

    @property
    def running(self) -> bool:
        """Whether the body keeps a running max (a row max of the scores, `reduce_max`) rather
        than the bounded max (`kernels.forward.check_bound`): every kernel holds both, and a query
        tile runs the running-max body only when its rows fail the bound's check."""
        return "reduce_max" in self.ops

    @property
    def matmuls(self) -> int:
        """`dot_general` primitives: the tile's two matmuls, which run on the MXU."""
        return self.ops.count("dot_general")

    @property
    def elementwise(self) -> tuple[str, ...]:
        """Every other primitive: compares, logic, selects, `exp`, reductions, casts."""
        return tuple(op for op in self.ops if op != "dot_general")


def _sub_jaxprs(eqn):
    """The jaxprs nested in one equation: `pl.when` branches, loop bodies, inner jits."""
    for value in eqn.params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if hasattr(item, "eqns"):
                yield item
            elif hasattr(getattr(item, "jaxpr", None), "eqns"):
                yield item.jaxpr


def _all_eqns(jaxpr):
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in _sub_jaxprs(eqn):
            yield from _all_eqns(sub)


def _shape(var):
    return getattr(getattr(var, "aval", None), "shape", None)


def tile_bodies(mask, method: str, *, heads: int = 1, head_dim: int = 128, dtype="bfloat16",
                block_q: int = 256, block_kv: int = 256, block_kv_compute: int | None = None) -> list[TileBody]:
    """The tile bodies of `method`'s kernel for `mask` (its token count sets the problem), traced.

    q, k, v are `[heads, mask.tokens, head_dim]` of `dtype`. Traced as a TPU compiles it (not as
    the interpreter runs it, whose lane broadcasts differ), on any machine. The default 256 x 256 tiles keep a
    tile of scores `[256, 256]` apart from the `[256, 128]` running max and sum; a key chunk
    of 128 would make the two indistinguishable and is refused.
    """
    import jax
    import jax.numpy as jnp

    fn = build_attention(mask, method=method, heads=heads, tokens=mask.tokens, head_dim=head_dim, dtype=dtype,
                         block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv_compute, interpret=False)
    x = jax.ShapeDtypeStruct((heads, mask.tokens, head_dim), jnp.dtype(dtype))
    bodies = []
    for loop in _all_eqns(jax.make_jaxpr(fn)(x, x, x).jaxpr):
        if loop.primitive.name != "scan":  # each tile body is a loop over key chunks
            continue
        eqns = list(_all_eqns(next(_sub_jaxprs(loop))))
        scores = next((_shape(e.outvars[0]) for e in eqns if e.primitive.name == "dot_general"), None)
        if scores is None:
            continue  # a loop that does no matmul is not a tile body
        if scores[-1] == _LANES:
            raise ValueError(f"a key chunk of {_LANES} makes a tile of scores {scores} look like the running "
                             f"max [block_q, {_LANES}]; trace with block_kv (or block_kv_compute) of 256 or more")
        touches = [e for e in eqns if e.primitive.name not in _WRAPPERS
                   and any(_shape(v) == scores for v in (*e.invars, *e.outvars))]
        bodies.append(TileBody(tuple(e.primitive.name for e in touches)))
    if not bodies:
        raise ValueError(f"found no tile body in the traced {method!r} kernel (no loop over key chunks with a matmul)")
    return bodies


def tile_body_table(bodies: dict, *, width: int = 96) -> str:
    """A text table of traced tile bodies, `bodies` mapping a label to `tile_bodies(...)`'s list.

    One line per body: its label, whether it masks, which max it subtracts (running or bounded),
    its matmuls and the count and names of its other per-pair primitives (the names wrapped to
    keep every line within `width` characters).
    """
    labels = max([8, *map(len, bodies)])  # eight wide, or as wide as the longest label
    head = f"{'kernel':{labels}} {'tile body':10} {'max':8} {'matmuls':>7} {'other':>5}  other primitives per pair"
    lines = [head, "-" * min(width, len(head))]
    for label, kernel_bodies in bodies.items():
        for body in kernel_bodies:
            kind = "masked" if body.masked else "mask-free"
            lead = (f"{label:{labels}} {kind:10} {'running' if body.running else 'bounded':8} {body.matmuls:>7} "
                    f"{len(body.elementwise):>5}  ")
            lines += textwrap.wrap(" ".join(body.elementwise), width=width, initial_indent=lead,
                                   subsequent_indent=" " * len(lead), break_on_hyphens=False)
    return "\n".join(lines)
