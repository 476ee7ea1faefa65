"""Kernel parameters by name, grouped as Pallas hands them over.

`pl.pallas_call` calls its kernel with one flat list of refs, in four groups: the scalar-prefetched
tables (SMEM), the inputs, the outputs, the scratch buffers; index maps get the grid's indices and
then the tables. `KernelRefs` names each group's refs once, beside the `pallas_call`, so that a kernel
is written with a signature that reads like its data,

    def kernel(*, schedule_ref, q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref): ...

instead of slicing `*refs` by position. A ref a build leaves out (a table or output used only by
some callers) is passed as None, so one signature serves every build.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass


def _names(group) -> tuple:
    """The names a group passes: a name, or `(name, present)` for a ref only some builds pass."""
    return tuple(n if isinstance(n, str) else n[0] for n in group if isinstance(n, str) or n[1])


def _absent(group) -> tuple:
    return tuple(n[0] for n in group if not isinstance(n, str) and not n[1])


@dataclass(frozen=True)
class KernelRefs:
    """The names of a kernel's refs, group by group, in the order `pallas_call` passes them.

    Each group is a tuple of names (`"q"` becomes the keyword `q_ref`); an entry `(name, present)`
    is a ref that only some builds pass: where `present` is false it arrives as None.
    """

    prefetch: tuple = ()
    inputs: tuple = ()
    outputs: tuple = ()
    scratch: tuple = ()

    def __post_init__(self):
        every = [n if isinstance(n, str) else n[0] for g in (self.prefetch, self.inputs, self.outputs, self.scratch)
                 for n in g]
        clash = sorted({n for n in every if every.count(n) > 1})
        if clash:
            raise ValueError(f"each ref needs one name; {clash} appear twice")

    def kernel(self, body):
        """`body(**refs)` as the kernel `pallas_call` calls with positional refs."""
        groups = (self.prefetch, self.inputs, self.outputs, self.scratch)
        names = sum((_names(g) for g in groups), ())
        absent = sum((_absent(g) for g in groups), ())

        @functools.wraps(body)
        def kernel(*refs):
            if len(refs) != len(names):
                raise TypeError(f"{body.__name__} got {len(refs)} refs for the {len(names)} named {names}")
            return body(**_by_name(names, refs, absent))
        return kernel

    def index_map(self, body):
        """`body(*grid_indices, **tables)` as the index map `pallas_call` calls with the grid's
        indices and then the scalar-prefetched tables."""
        names, absent = _names(self.prefetch), _absent(self.prefetch)

        @functools.wraps(body)
        def index_map(*args):
            grid, tables = (args[:-len(names)], args[-len(names):]) if names else (args, ())
            return body(*grid, **_by_name(names, tables, absent))
        return index_map


def _by_name(names, refs, absent) -> dict:
    return {**{f"{n}_ref": r for n, r in zip(names, refs)}, **{f"{n}_ref": None for n in absent}}
