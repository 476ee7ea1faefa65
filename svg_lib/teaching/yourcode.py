"""What every `your-code` cell of the series shares: the learner writes one piece of a kernel, a
checker says what is wrong, hints come one at a time, and the cells below run whichever piece passed.

A notebook's `your-code` cell defines the learner's piece (a function: an index map, a tile body, a
dispatch, a rounding). The cell after it runs the piece's checker (a `check_*` of
`svg_lib.teaching.exercises`, which prints PASSED-style or "not yet" verdicts with the failing case,
expected against got, and a hint naming the likely mistake) and then `choose(...)`, which returns the
learner's piece when it passed and the library's otherwise, and says which one the cells below run;
`whose(...)` gives the words a later cell prints to say whose piece it ran.
`Hints` reveals a piece's hints one at a time (a button in Jupyter, `.next()` anywhere), the last
"hint" being the solution. `cost_line` prints what a kernel at the learner's tile sizes costs.
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass

from svg_lib.chips import MXUS_FOR_CLOCK, TARGETS, clock_hz
from svg_lib.core.masks import Mask
from svg_lib.memory.smem import schedule_smem
from svg_lib.memory.vmem import MiB, estimate_vmem
from svg_lib.methods import MethodPlans, check_method
from svg_lib.instruments.tools.measured import shipped_row
from svg_lib.instruments.tpu.cost import load_reference, model_cycles, step_kinds
from svg_lib.problem import get_preset


@dataclass(frozen=True)
class Hints:
    """A piece's hints, revealed one at a time; the last one is the solution.

    `hints` are short texts (each a step closer to the answer); `solution` is the source of a
    working piece, shown last. In Jupyter the object displays as a button that shows the next
    hint on each click; `.next()` prints the next one (for a terminal, or a notebook without
    widgets); `.all()` returns every text, the solution last (for tests and instructors).
    """

    piece: str
    hints: tuple
    solution: str

    def __post_init__(self):
        if len(self.hints) < 3:
            raise ValueError(f"{self.piece}: give at least three hints before the solution, got {len(self.hints)}")
        object.__setattr__(self, "_shown", [0])

    def all(self) -> list:
        n = len(self.hints)
        return [f"Hint {i} of {n}: {h}" for i, h in enumerate(self.hints, 1)] + [f"Solution:\n{self.solution}"]

    def next(self) -> None:
        """Print the next hint (the solution after the last hint; then the solution again). Nothing is
        returned, so a cell ending in `hints.next()` shows the text once, as printed."""
        texts = self.all()
        text = texts[min(self._shown[0], len(texts) - 1)]
        self._shown[0] += 1
        print(text)

    def _ipython_display_(self):
        try:
            import ipywidgets as widgets
            from IPython.display import display
        except ImportError:
            print(f"{self.piece}: {len(self.hints)} hints and a solution; call .next() to see the next one")
            return
        texts = self.all()
        button = widgets.Button(description=f"Hint 1 of {len(self.hints)}")
        out = widgets.HTML()
        shown = [0]

        def reveal(_):
            shown[0] += 1
            out.value = "".join(f"<pre style='white-space: pre-wrap'>{html.escape(t)}</pre>" for t in texts[:shown[0]])
            left = len(texts) - shown[0]
            button.description = ("Solution" if left == 1 else f"Hint {shown[0] + 1} of {len(self.hints)}")
            button.disabled = left == 0

        button.on_click(reveal)
        display(widgets.VBox([widgets.Label(f"{self.piece}: stuck? one hint at a time"), button, out]))


def choose(result, yours, library, *, piece: str):
    """The piece the cells below run: `yours` when `result` (a checker's CheckResult) passed, else
    `library`, svg_lib's own. Prints which, so a reader always knows whose kernel they are watching."""
    if result.passed:
        print(f"The cells below run your {piece}.")
        return yours
    print(f"The cells below run svg_lib's {piece} until yours passes the check above.")
    return library


def whose(result, piece: str) -> str:
    """"your <piece>" when `result` passed, else "svg_lib's <piece>": the words a later cell prints
    beside what it ran, so its line names the code that ran rather than assuming the learner's did."""
    return f"your {piece}" if result.passed else f"svg_lib's {piece}"


def _probed(chip: str, block_q: int, block_kv: int):
    """The committed per-step costs of svg_lib's bodies at these tiles on `chip`, or None."""
    return load_reference()["groups"]["after"].get((chip, block_q, block_kv))


def _measured(mask: Mask, method: str, block_q: int, block_kv: int, heads: int) -> dict | None:
    """The v5e row measuring `method` at these tiles, where `mask` and `heads` are the case study's."""
    blog = get_preset("blog")
    if heads != blog.heads or mask != blog.mask():
        return None
    return shipped_row(method, block_q, block_kv)


def cost_line(mask: Mask, method: str, block_q: int, block_kv: int, *, heads: int = 1, head_dim: int = 128,
              dtype="bfloat16", chips=("v5e", "v6e")) -> str:
    """One line (and a second for time) on what `method` ("b1", "b2", "b3", "dense") costs over
    `mask` at `block_q` x `block_kv`: tiles visited, tiles masked, grid steps, VMEM per chip with its
    fit verdict, the schedule's SMEM, and where the compiler's static profile was committed for these
    tiles, the predicted time per chip (a simulation of a TPU, compile-only; the clock is assumed,
    `chips.clock_hz`), elsewhere the visited tiles' MXU floor per chip (a lower bound), and where a TPU
    measured the case study's problem at these tiles, that time. Computed from the plan: no N x N array, any size up to the case study's."""
    record = check_method(method)
    plans = MethodPlans.of(mask, block_q, block_kv, tile_aligned=record.rounds_to_tiles)
    kinds = step_kinds(method, plans)
    rows = kinds["rows"]
    steps = sum(n for k, n in kinds.items() if k != "rows")
    visited = steps - kinds.get("idle", 0)
    masked = sum(n for k, n in kinds.items() if k.endswith("masked"))
    parts = [f"{method}: {visited:,} tiles visited, {masked:,} masked, {steps:,} grid steps a head ({rows} rows)"]
    vmem = []
    for chip in chips:
        est = estimate_vmem(method, block_q, block_kv, head_dim, dtype, generation=chip)
        vmem.append(f"{chip} {est.total / MiB:.1f} of {est.budget / MiB:.0f} MiB {'fits' if est.fits else 'DOES NOT FIT'}")
    parts.append("VMEM " + ", ".join(vmem))
    if record.planned:
        used = plans.for_method(record)
        smem = schedule_smem(heads, used.grid[0], used.steps, chips[-1])
        parts.append(f"SMEM {smem.total / 1024:.1f} KiB")
    times = []
    for chip in chips:
        cost = _probed(chip, block_q, block_kv)
        if cost is None or chip not in MXUS_FOR_CLOCK:
            continue
        try:
            cycles = model_cycles(method, cost, plans, heads)
        except ValueError:  # a body kind not probed at these tiles
            continue
        times.append(f"{chip} {cycles / clock_hz(chip) * 1e3:.3f} ms")
    if times:
        time = "predicted (static profile, simulated; clock assumed): " + ", ".join(times)
    else:
        # no profile at these tiles: the analytic floor, the visited tiles' two matmuls at each chip's peak
        flops = visited * heads * 4 * block_q * block_kv * head_dim
        floor = ", ".join(f"{chip} {flops / (TARGETS[chip].bf16_tflops * 1e12) * 1e3:.3f} ms" for chip in chips)
        time = f"MXU floor (the visited tiles' matmuls at each chip's bf16 peak; a lower bound, not a prediction): {floor}"
    measured = _measured(mask, method, block_q, block_kv, heads)
    if measured is not None:
        time += (f"\n  measured on a TPU {measured['chip']} (compiled, jax {measured['jax']}): "
                 f"{measured['median_ms']:.1f} ms median of {measured['repeats']} calls "
                 f"(svg_lib/data/tpu_measurements.json)")
    return "; ".join(parts) + "\n  " + time
