"""The TPU compiler's refusals, read: what kind (VMEM, SMEM, other) and the lines worth showing.

Compiler messages can run to pages; these keep their first lines, or the memory overflow's
numbers, which sit deep inside them.
"""
from __future__ import annotations

import re

_OOM = re.compile(r"(CompileTimeScopedVmemOom|Ran out of memory in memory space (\w+)|"
                  r"Scoped allocation with size ([\d.]+\w?) and limit ([\d.]+\w?))")


def classify_error(err: BaseException) -> str:
    """"vmem", "smem" or "compile": what kind of refusal a compiler error is."""
    text = str(err)
    if "CompileTimeScopedVmemOom" in text or "memory space vmem" in text:
        return "vmem"
    if "memory space smem" in text:
        return "smem"
    return "compile"


def first_lines(err: BaseException, lines: int = 4) -> str:
    """The exception's type and its first few lines: compiler messages can run to pages."""
    text = f"{type(err).__name__}: {err}".strip()
    keep = [line for line in text.splitlines() if line.strip()]
    return "\n".join(keep[:lines])


def refusal_summary(err: BaseException) -> str:
    """One line that says why the compiler refused: the memory overflow's numbers when it is
    one (they sit deep in a long message), else the message's first line."""
    text = str(err)
    scoped = re.search(r"Scoped allocation with size ([\d.]+\w?) and limit ([\d.]+\w?)", text)
    if scoped:
        return f"VMEM overflow: a scoped allocation of {scoped.group(1)} exceeds the limit {scoped.group(2)}"
    used = re.search(r"Ran out of memory in memory space (\w+)\. Used ([\d.]+\w?) of ([\d.]+\w?)", text)
    if used:
        return f"{used.group(1).upper()} overflow: {used.group(2)} used of {used.group(3)}"
    return first_lines(err, 1)
