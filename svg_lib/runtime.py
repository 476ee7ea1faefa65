"""Where the code runs: `detect_runtime()` tells a notebook whether Pallas TPU kernels will
compile (on a TPU) or run in interpret mode (everywhere else), so a notebook never hard-codes a
device; `notebook_data_file` finds the recorded data the notebooks read. The problem sizes the
series uses (presets) live in `svg_lib.problem`.

jax is imported inside functions only: importing this module stays cheap.
"""
from __future__ import annotations

from dataclasses import dataclass

from svg_lib.chips import parse_tpu_generation


@dataclass(frozen=True)
class Runtime:
    """What `jax.devices()` reports, and what that means for the Pallas kernels."""

    platform: str      # "tpu" | "gpu" | "cpu"
    device_kind: str   # e.g. "TPU v6 lite"; "cpu" on a CPU
    device_count: int
    jax_version: str
    compiled: bool     # True only on a TPU: Pallas TPU kernels compile to Mosaic there

    @property
    def mode(self) -> str:
        """"compiled" on a TPU, "interpret" elsewhere (the kernels run as an XLA loop)."""
        return "compiled" if self.compiled else "interpret"

    @property
    def tpu_generation(self) -> str | None:
        """e.g. "v6e" on a TPU v6e ("TPU v6 lite"); None off TPU or for a TPU name we do not know
        (see `svg_lib.memory.vmem.tpu_generation`, which refuses to plan for such a chip)."""
        return parse_tpu_generation(self.device_kind) if self.platform == "tpu" else None

    def banner(self) -> str:
        """One line for the top of a notebook: jax version, devices, and how kernels run."""
        devices = f"{self.device_count} device{'s' if self.device_count != 1 else ''}"
        where = self.platform if self.device_kind.lower() == self.platform else f"{self.platform} {self.device_kind}"
        if self.compiled:
            gen = f", {self.tpu_generation}" if self.tpu_generation else ""
            kernels = f"kernels: compiled (Mosaic{gen})"
        else:
            kernels = "kernels: interpret mode (no TPU)"
        return f"jax {self.jax_version} | {where} ({devices}) | {kernels}"


def detect_runtime() -> Runtime:
    """Inspect jax's default backend (the first device decides the platform)."""
    import jax

    devices = jax.devices()
    first = devices[0]
    platform = str(first.platform).lower()
    kind = str(getattr(first, "device_kind", platform) or platform)
    return Runtime(platform=platform, device_kind=kind, device_count=len(devices),
                   jax_version=jax.__version__, compiled=platform == "tpu")


def default_interpret() -> bool:
    """The `interpret=` a Pallas TPU kernel needs here: True unless running on a TPU."""
    return not detect_runtime().compiled


def notebook_data_file(name: str):
    """The path of `notebooks/data/<name>` in the checkout svg_lib was imported from.

    Found relative to the svg_lib package, not the working directory: a notebook may run from
    the repository root, from notebooks/, or on Colab from /content. A missing file raises
    FileNotFoundError naming the path looked at and how the files get there.
    """
    from pathlib import Path

    if not isinstance(name, str) or not name or "/" in name or "\\" in name or name in (".", ".."):
        raise ValueError(f"name must be a plain file name inside notebooks/data, got {name!r}")
    folder = Path(__file__).resolve().parent.parent / "notebooks" / "data"
    path = folder / name
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: svg_lib was imported from {Path(__file__).resolve().parent}, and the recorded "
            f"data the notebooks read lives in notebooks/data of the same checkout. Use a full clone of the "
            f"repository (pip install -e <clone>), not an installed copy of svg_lib alone")
    return path
