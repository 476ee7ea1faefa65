"""What a tuning run measured: `TuneResult`, one row per candidate block size, and its table,
plot and JSON form (the tuner, `svg_lib.instruments.tools.tuner.tune`, makes one)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class TuneResult:
    """What `tune` measured: one row (a dict) per candidate; `best` is the row with the lowest median."""

    method: str
    problem: dict        # mask description, heads, head_dim, dtype
    runtime: dict        # platform, device kind, jax version, mode
    rows: list           # see ROW_KEYS
    rejected: list = field(default_factory=list)  # candidates that could not run here, with reasons
    repeats: int = 3
    warmup: int = 1
    from_cache: bool = False
    cache_path: str | None = None
    target: dict | None = None  # {"name", "libtpu"}: candidates were compile-checked for this TPU

    ROW_KEYS = ("block_q", "block_kv", "block_kv_compute", "median_ms", "min_ms", "times_ms", "masked_fraction",
                "visited_fraction", "tiles_visited", "tiles_masked", "grid_steps", "vmem_bytes", "build_s",
                "compile_s")

    @property
    def best(self) -> dict | None:
        return min(self.rows, key=lambda r: r["median_ms"]) if self.rows else None

    @property
    def least_masking(self) -> dict | None:
        """The row that masks the smallest fraction of its visited tiles (ties: the faster)."""
        return min(self.rows, key=lambda r: (r["masked_fraction"], r["median_ms"])) if self.rows else None

    def header(self) -> str:
        r, p = self.runtime, self.problem
        source = " (from cache)" if self.from_cache else ""
        checked = (f" | compile-checked for {self.target['name']} (libtpu {self.target['libtpu']})"
                   if self.target else "")
        return (f"tune {self.method} on {r['platform']} ({r['device_kind']}) | {r['mode']} mode | jax {r['jax']} | "
                f"{p['mask']['tokens']:,} tokens x {p['heads']} heads x {p['head_dim']}, {p['dtype']}{checked}{source}")

    def table(self) -> str:
        """Fixed-width text: one line per candidate (fastest first), then the best and the rejected."""
        cols = [("block_q", 7), ("block_kv", 8), ("compute", 7), ("median ms", 10), ("min ms", 9),
                ("masked", 7), ("visited", 8), ("steps", 7), ("VMEM MiB", 8)]
        lines = [self.header(), "  ".join(t.rjust(w) for t, w in cols), "  ".join("-" * w for _, w in cols)]
        best = self.best
        # interpret-mode times are one noisy host run: the fastest of this run, not a best tile for a TPU
        best_mark = "  <- fastest this run" if self.runtime.get("mode") == "interpret" else "  <- best"
        for row in sorted(self.rows, key=lambda r: r["median_ms"]):
            cells = [f"{row['block_q']}", f"{row['block_kv']}",
                     "-" if row["block_kv_compute"] is None else f"{row['block_kv_compute']}",
                     f"{row['median_ms']:.2f}", f"{row['min_ms']:.2f}", f"{row['masked_fraction']:.2f}",
                     f"{row['visited_fraction']:.2f}", f"{row['grid_steps']:,}", f"{row['vmem_bytes'] / 2**20:.1f}"]
            mark = best_mark if row is best else ""
            lines.append("  ".join(c.rjust(w) for c, (_, w) in zip(cells, cols)) + mark)
        if best is not None:
            least = self.least_masking
            lines.append(f"best: block_q={best['block_q']}, block_kv={best['block_kv']}"
                         + (f", block_kv_compute={best['block_kv_compute']}" if best["block_kv_compute"] else "")
                         + f": {best['median_ms']:.2f} ms (median of {self.repeats})")
            interpret = self.runtime.get("mode") == "interpret"
            if least is not best or interpret:
                # in interpret mode the order of the times says nothing about a TPU: no finding from it
                lines.append(f"least masking ({least['masked_fraction']:.2f} of visited tiles): "
                             f"{least['block_q']} x {least['block_kv']} at {least['median_ms']:.2f} ms"
                             + ("; interpret-mode times do not rank tile sizes for a TPU, only compiled ones do"
                                if interpret else " - not the fastest"))
        else:
            lines.append("no candidate could run here")
        lines.append("masked = masked tiles / visited tiles; visited = visited tiles / all tiles; steps = grid "
                     "steps per head.")
        if self.runtime.get("mode") == "interpret":
            lines.append("interpret mode: an XLA loop on the host, not TPU times; grid steps and tile counts "
                         "carry over to a TPU, the masking cost does not.")
        for r in self.rejected:
            compute = "" if r["block_kv_compute"] is None else f" (compute {r['block_kv_compute']})"
            lines.append(f"rejected {r['block_q']} x {r['block_kv']}{compute}: {r['reason']}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def to_json(self) -> dict:
        return {"method": self.method, "problem": self.problem, "runtime": self.runtime,
                "rows": [dict(r) for r in self.rows], "rejected": [dict(r) for r in self.rejected],
                "repeats": self.repeats, "warmup": self.warmup, "target": self.target}

    @classmethod
    def from_json(cls, data: dict, **extra) -> "TuneResult":
        return cls(method=data["method"], problem=data["problem"], runtime=data["runtime"],
                   rows=[dict(r) for r in data["rows"]], rejected=[dict(r) for r in data.get("rejected", [])],
                   repeats=data.get("repeats", 3), warmup=data.get("warmup", 1), target=data.get("target"), **extra)

    def _where(self) -> str:
        r = self.runtime
        return f"{r['platform']} {r['device_kind']}, {r['mode']} mode, jax {r['jax']}"

    def heatmap(self, ax=None):
        """Median ms over (block_q on y, block_kv on x); the best cell is outlined. Returns the Figure.

        With several block_kv_compute values for one (block_q, block_kv), the fastest is shown.
        """
        import matplotlib.pyplot as plt
        from matplotlib.patches import Rectangle

        if not self.rows:
            raise ValueError("no measured candidates to draw (every candidate was rejected; see .rejected)")
        bqs = sorted({r["block_q"] for r in self.rows})
        bkvs = sorted({r["block_kv"] for r in self.rows})
        grid = np.full((len(bqs), len(bkvs)), np.nan)
        for r in self.rows:
            i, j = bqs.index(r["block_q"]), bkvs.index(r["block_kv"])
            grid[i, j] = r["median_ms"] if np.isnan(grid[i, j]) else min(grid[i, j], r["median_ms"])
        if ax is None:
            fig, ax = plt.subplots(figsize=(1.4 * len(bkvs) + 3.2, 1.0 * len(bqs) + 2.0), layout="constrained")
        else:
            fig = ax.figure
        image = ax.imshow(np.ma.masked_invalid(grid), cmap="viridis_r", aspect="auto")
        fig.colorbar(image, ax=ax, label="median ms per call (lower is better)")
        lo, hi = np.nanmin(grid), np.nanmax(grid)
        for i in range(len(bqs)):
            for j in range(len(bkvs)):
                if not np.isnan(grid[i, j]):
                    # white on the dark (slow) end of the colour map, black on the light (fast) end
                    dark = hi > lo and (grid[i, j] - lo) / (hi - lo) > 0.5
                    ax.text(j, i, f"{grid[i, j]:.1f}", ha="center", va="center", fontsize=8,
                            color="white" if dark else "black")
        best = self.best
        bi, bj = bqs.index(best["block_q"]), bkvs.index(best["block_kv"])
        ax.add_patch(Rectangle((bj - 0.5, bi - 0.5), 1, 1, fill=False, edgecolor="#d55e00", linewidth=2.5))
        ax.set_xticks(range(len(bkvs)), [str(b) for b in bkvs])
        ax.set_yticks(range(len(bqs)), [str(b) for b in bqs])
        ax.set_xlabel("block_kv")
        ax.set_ylabel("block_q")
        ax.set_title(f"{self.method}: median ms by tile size (best outlined)\n{self._where()}", fontsize=9)
        return fig

    def scatter(self, ax=None):
        """Median ms against the masked fraction of visited tiles, one point per candidate. Returns the Figure."""
        import matplotlib.pyplot as plt

        if not self.rows:
            raise ValueError("no measured candidates to draw (every candidate was rejected; see .rejected)")
        if ax is None:
            fig, ax = plt.subplots(figsize=(6.4, 4.2), layout="constrained")
        else:
            fig = ax.figure
        x = [r["masked_fraction"] for r in self.rows]
        y = [r["median_ms"] for r in self.rows]
        ax.scatter(x, y, color="#0072b2", zorder=3)
        for r in self.rows:
            ax.annotate(f"{r['block_q']}x{r['block_kv']}", (r["masked_fraction"], r["median_ms"]),
                        xytext=(4, 3), textcoords="offset points", fontsize=7)
        best = self.best
        ax.scatter([best["masked_fraction"]], [best["median_ms"]], s=160, facecolors="none",
                   edgecolors="#d55e00", linewidths=2, zorder=4, label="fastest")
        ax.set_xlabel("masked fraction (masked tiles / visited tiles)")
        ax.set_ylabel("median ms per call")
        ax.legend(fontsize=8)
        ax.set_title(f"{self.method}: time against masking work\n{self._where()}", fontsize=9)
        return fig


