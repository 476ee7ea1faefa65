"""What the kernels measured on a real TPU: svg_lib/data/tpu_measurements.json, read and compared.

The record is written by `tools/tpu-measure.py` on a TPU (wall-clock medians of repeated calls at the
case study's problem: 75,600 tokens, 10 heads x 128, bf16, SVG spatial mask at density 0.35); each row
names its chip, date, jax, jaxlib and libtpu, the tiles, how the key-slice loop was compiled, and the
commit measured. Here it is read back: the row that measured the kernel as it ships (`shipped_row`),
a table beside the case study's v6e figures and the compiler's static-profile prediction for each chip
(`measured_table`), and the evidence behind the unroll rule (`unroll_evidence`).
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np

from svg_lib.chips import MXUS_FOR_CLOCK, clock_hz
from svg_lib.instruments.tpu.cost import committed_tile_cost, model_cycles
from svg_lib.kernels.forward import CODE_BUDGET, UNROLL_ORDER, body_copies, code_bytes, unroll_factor, unrolled_bodies
from svg_lib.kernels.grid import TileSizes
from svg_lib.methods import BASELINE, METHODS, MODEL_METHODS, SERIES_METHODS, MethodPlans, check_method
from svg_lib.problem import BLOG_V6E_MS, default_block_kv_compute, get_preset

MEASUREMENTS_FILE = Path(__file__).resolve().parents[2] / "data" / "tpu_measurements.json"
# the kinds of tile body, (bounded, masked), each of the series' kernels compiles for one kind of head
BODIES = {name: frozenset(kind for kind, n in body_copies(1, METHODS[name].mask_free_body).items() if n)
          for name in SERIES_METHODS}
CODE_SIZES_FILE = MEASUREMENTS_FILE.parent / "tpu_code_sizes.json"
LABELS = {"splash_dense": "B0 dense Splash", "dense": "svg_lib dense", "b1": "B1 naive", "b2": "B2 full/edge",
          "b3": "B3 tile-aligned"}


@functools.lru_cache(maxsize=None)
def _load(path: str) -> tuple:
    return tuple(json.loads(Path(path).read_text())["rows"])


def load_code_sizes(path: Path = CODE_SIZES_FILE) -> list[dict]:
    """Every forward program the record timed, with the bytes of code the compiler made of it
    (`code_bytes`, compile-only: tools/code-sizes.py)."""
    return [dict(p) for p in json.loads(Path(path).read_text())["programs"]]


def body_names(kinds) -> list[list[str]]:
    """Kinds of body, (bounded, masked), as the records write them: sorted ["bounded" | "running", "masked" | "free"]."""
    return sorted([["bounded" if b else "running", "masked" if m else "free"] for b, m in kinds])


def program_unrolled(program: dict) -> frozenset:
    """The kinds of body, (bounded, masked), a row or program of the records unrolled (`unrolled_bodies`,
    written by `body_names`)."""
    return frozenset((b == "bounded", m == "masked") for b, m in program.get("unrolled_bodies", ()))


def fit_code_bytes(programs) -> tuple[float, float, dict]:
    """The least-squares fit of the compiler's `code_bytes` over `programs` by the terms of
    `forward.code_bytes`: (fixed bytes, bytes per query row, {kind of body: bytes per score element})."""
    terms, sizes_out = [], []
    for p in programs:
        sizes, unrolled = TileSizes(p["block_q"], p["block_kv"], p["block_kv_compute"]), program_unrolled(p)
        copies = body_copies(1, METHODS[p["method"]].mask_free_body)
        terms.append([1.0, sizes.block_q] + [copies[k] * (unroll_factor(sizes.slices) if k in unrolled else 1) * sizes.block_q
                                             * sizes.block_kv_compute for k in UNROLL_ORDER])
        sizes_out.append(p["code_bytes"])
    fit = np.linalg.lstsq(np.array(terms), np.array(sizes_out, float), rcond=None)[0]
    return float(fit[0]), float(fit[1]), dict(zip(UNROLL_ORDER, map(float, fit[2:])))


def load_measurements(path: Path = MEASUREMENTS_FILE) -> list[dict]:
    """Every row of the record, as written by tools/tpu-measure.py."""
    return [dict(r) for r in _load(str(path))]


def loop_name(method: str, sizes: TileSizes, unrolled) -> str | None:
    """How a kernel of `method` compiles its key-slice loop with the kinds of body `unrolled`: "one slice",
    "unrolled" (every body), "partly unrolled" or "rolled"; None for Splash, whose loop is its own."""
    if method not in BODIES:
        return None
    if sizes.slices == 1:
        return "one slice"
    unrolled = BODIES[method] & frozenset(unrolled)
    return "unrolled" if unrolled == BODIES[method] else "partly unrolled" if unrolled else "rolled"


def shipped_loop(method: str, block_q: int, block_kv: int, block_kv_compute: int) -> str | None:
    """`loop_name` of the kernel as it ships at these tiles (`forward.unrolled_bodies`)."""
    sizes = TileSizes(block_q, block_kv, block_kv_compute)
    return loop_name(method, sizes, unrolled_bodies(sizes, 1, METHODS[method].mask_free_body))


def row_unrolled(row: dict) -> frozenset | None:
    """The kinds of body, (bounded, masked), a measured row's kernel unrolled: recorded as
    `unrolled_bodies` (["bounded" | "running", "masked" | "free"] pairs), or read from its loop where
    it ran all or none; None for Splash and single slices."""
    if "unrolled_bodies" in row:
        return program_unrolled(row)
    return {"rolled": frozenset(), "unrolled": BODIES.get(row.get("method"))}.get(row.get("loop"))


def shipped_row(method: str, block_q: int, block_kv: int, *, chip: str = "v5e", part: str = "forward",
                rows=None) -> dict | None:
    """The measured row of `method` at `block_q` x `block_kv` whose key-slice loop compiled as the kernel now
    compiles it (the newest such row; at the default key slices where those were measured, else at the
    row's own `block_kv_compute`), or None where none was measured."""
    check_method(method)
    rows = load_measurements() if rows is None else rows
    parts = (part, "splash") if part == "forward" else (part,)  # Splash's block-size search is forward too
    found = [r for r in rows if r.get("chip") == chip and r.get("part") in parts and r.get("method") == method and r.get("block_q") == block_q and r.get("block_kv") == block_kv
             and "median_ms" in r and r.get("backward") in (None, "fused")]
    if method in BODIES and part == "forward":
        found = [r for r in found if compiled_as_shipped(r)]
        slices = default_block_kv_compute(block_q, block_kv)   # the shipped slices where measured
        found = [r for r in found if r["block_kv_compute"] == slices] or found
    return sorted(found, key=lambda r: r.get("date", ""))[-1] if found else None   # same day: the later row


def compiled_as_shipped(row: dict) -> bool:
    """Whether a measured row's key-slice loop is the one its kernel now compiles at the row's tiles and
    key slices (a row of one slice, or of a loop recorded by name, reads as the kinds its loop unrolled);
    always for Splash, whose loop is its own."""
    method = row.get("method")
    if method not in BODIES:
        return True
    sizes = TileSizes(row["block_q"], row["block_kv"], row["block_kv_compute"])
    return BODIES[method] & (row_unrolled(row) or frozenset()) == unrolled_bodies(sizes, 1, METHODS[method].mask_free_body)


def fastest_row(method: str, chip: str = "v5e", rows=None) -> dict | None:
    """The fastest forward row of `method` measured on `chip`, at any tiles, among those compiled as the
    kernel now compiles them (`compiled_as_shipped`), or None where none was measured."""
    check_method(method)
    rows = load_measurements() if rows is None else rows
    found = [r for r in rows if r.get("chip") == chip and r.get("method") == method and "median_ms" in r
             and r.get("part") in ("forward", "splash") and compiled_as_shipped(r)]
    return min(found, key=lambda r: r["median_ms"]) if found else None


def best_splash(chip: str = "v5e", rows=None) -> dict | None:
    """The fastest Splash dense row measured on `chip`, at any block sizes: the B0 to beat."""
    return fastest_row(BASELINE, chip, rows)


def predicted_ms(method: str, chip: str, block_q: int, block_kv: int, block_kv_compute: int,
                 heads: int = 10) -> float | None:
    """The cost model's time for the case study's problem (the compiler's static profile of each tile
    body, committed; simulated, with an assumed clock), or None where the profile has no figure."""
    if chip not in MXUS_FOR_CLOCK:
        return None
    cost = committed_tile_cost(chip, block_q, block_kv, block_kv_compute)
    if cost is None:
        return None
    mask = get_preset("blog").mask()
    plans = MethodPlans.of(mask, block_q, block_kv)
    try:
        return model_cycles(method, cost, plans, heads) / clock_hz(chip) * 1e3
    except ValueError:  # a body the profile could not simulate on this chip
        return None


def measured_table(block_q: int = 3328, block_kv: int = 1536, *, chip: str = "v5e",
                   methods=MODEL_METHODS, rows=None) -> str:
    """A table: each method measured on `chip` at these tiles (median ms, spread, share of the MXU's peak),
    beside the static profile's prediction for that chip (and its error against the measurement), the
    case study's v6e figure and the prediction for a v6e."""
    rows = load_measurements() if rows is None else rows
    lines = []
    head = (f"{'':16}{chip + ' measured':>16}{'spread':>14}{'MXU':>6}{chip + ' model':>11}{'model/meas':>11}"
            f"{'v6e case study':>16}{'v6e model':>11}")
    lines.append(head)
    first, dates = None, set()
    for method in methods:
        row = shipped_row(method, block_q, block_kv, chip=chip, rows=rows)
        if row is None:
            continue
        first = first or row
        dates.add(row["date"])
        bkc = row["block_kv_compute"]
        model = predicted_ms(method, chip, block_q, block_kv, bkc)
        model_v6e = predicted_ms(method, "v6e", block_q, block_kv, bkc)
        blog = BLOG_V6E_MS.get(method) if (block_q, block_kv) == (3328, 1536) else None
        cells = [f"{row['median_ms']:>13.1f} ms", f"{row['min_ms']:.1f}-{row['max_ms']:.1f}",
                 f"{row['mxu_fraction']:.2f}" if row.get("mxu_fraction") else "-",
                 f"{model:.1f}" if model else "-", f"{model / row['median_ms']:.2f}" if model else "-",
                 f"{blog:.2f} ms" if blog else "-", f"{model_v6e:.1f}" if model_v6e else "-"]
        lines.append(f"{LABELS.get(method, method):16}{cells[0]:>16}{cells[1]:>14}{cells[2]:>6}{cells[3]:>11}"
                     f"{cells[4]:>11}{cells[5]:>16}{cells[6]:>11}")
    if first is None:
        return f"nothing measured on a {chip} at {block_q} x {block_kv}"
    span = sorted(dates)
    when = span[0] if len(span) == 1 else f"{span[0]} to {span[-1]}"
    lines.append(f"{chip}: {first['device_kind']}, compiled, jax {first['jax']}, libtpu {first['libtpu']}, "
                 f"{when}; median of {first['repeats']} calls (spread: min-max); MXU: the visited tiles' "
                 f"matmuls at the chip's bf16 peak over the median. model: the compiler's static profile "
                 f"(simulated, clock assumed), summed over the plan.")
    return "\n".join(lines)


def unroll_evidence(rows=None) -> list[dict]:
    """Every (method, tiles) measured with more than one key-slice loop: each loop's median
    (`{loop: ms}`, the loops by `row_unrolled`, the newest row of each), the kinds of body the kernel
    now unrolls (`forward.unrolled_bodies`) and its estimated `code_bytes` with each loop."""
    rows = load_measurements() if rows is None else rows
    groups = {}
    for r in rows:
        if r.get("part") == "forward" and r.get("method") in BODIES and "median_ms" in r and row_unrolled(r) is not None:
            key = (r["method"], r["block_q"], r["block_kv"], r["block_kv_compute"])
            groups.setdefault(key, {})[BODIES[r["method"]] & row_unrolled(r)] = r["median_ms"]
    out = []
    for (method, bq, bkv, bkc), loops in sorted(groups.items()):
        if len(loops) > 1:
            sizes, free = TileSizes(bq, bkv, bkc), METHODS[method].mask_free_body
            out.append({"method": method, "block_q": bq, "block_kv": bkv, "block_kv_compute": bkc, "ms": loops,
                        "code_bytes": {u: code_bytes(sizes, u, 1, free) for u in loops},
                        "chosen": unrolled_bodies(sizes, 1, free), "budget": CODE_BUDGET})
    return out
