"""What svg_lib needs from the Python it runs in, checked before anything imports jax.

Standard library only, so that a missing or too old package is named with what to run instead of
surfacing as an AttributeError deep inside a notebook. pyproject.toml's dependencies give the same
floors (tests/test_environment.py checks they agree); jaxlib is jax's to pin. The floors are the oldest versions tested:
Colab's TPU runtime (`make test-colab`, tools/colab-tpu-runtime.txt).
"""
from __future__ import annotations

import glob
import importlib.util
import os
import re
from importlib import metadata

# distribution -> oldest version svg_lib is tested with
FLOORS = {"numpy": "2.1", "matplotlib": "3.10", "ipywidgets": "7.7", "tqdm": "4.67", "jax": "0.7.2"}


def version_tuple(version: str) -> tuple[int, ...]:
    """"0.7.2" -> (0, 7, 2); a suffix such as "rc1" or "+cpu" ends the numbers."""
    numbers = []
    for part in version.split("."):
        match = re.match(r"\d+", part)
        if match is None:
            break
        numbers.append(int(match.group()))
        if match.end() < len(part):
            break
    return tuple(numbers)


def problems(installed=None) -> list[str]:
    """One line per package that is missing or older than its floor; [] when all is well.

    `installed(name)` gives a distribution's version or raises PackageNotFoundError (default:
    importlib.metadata.version); tests pass their own."""
    installed = installed or metadata.version
    found = []
    for name, floor in FLOORS.items():
        try:
            have = installed(name)
        except metadata.PackageNotFoundError:
            found.append(f"{name} is not installed (svg_lib needs {name}>={floor})")
            continue
        if version_tuple(have) < version_tuple(floor):
            found.append(f"{name} {have} is older than svg_lib needs ({name}>={floor})")
    return found


def check_environment(installed=None) -> None:
    """Raise ImportError naming each missing or too old package, and what to run about it."""
    found = problems(installed)
    if not found:
        return
    wanted = [n for n in FLOORS if any(line.startswith(n + " ") for line in found)]
    names = " ".join(f'"{n}>={FLOORS[n]}"' for n in wanted)
    if "jax" not in wanted:  # only what is missing: nothing about jax or TPUs when jax is fine
        raise ImportError("svg_lib cannot start: " + "; ".join(found) + f". Run: pip install {names} "
                          "(then restart the kernel).")
    others = " ".join(f'"{n}>={FLOORS[n]}"' for n in wanted if n != "jax")
    raise ImportError(
        "svg_lib cannot start: " + "; ".join(found) + ". On a machine without a TPU run: "
        f"pip install {names}. On a TPU runtime (Colab, a TPU VM) upgrade jax with the libtpu that belongs "
        "to it: pip install -U \"jax[tpu]>=" + FLOORS["jax"] + "\"" + (f" {others}" if others else "")
        + " (then restart the kernel).")


def installed_version(name: str) -> str | None:
    """An installed distribution's version ("0.0.42.1" for libtpu), or None when it is absent."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


# -- libtpu, the TPU compiler (optional: Linux x86_64 wheels only) ---------------------------------

INSTALL_HINT = ('pip install -e ".[tpu-compile]"  (from the repository root; `make test` installs it, '
                "`make lab` does not). It pins libtpu to the version the installed jax expects.")


class MissingCompiler(RuntimeError):
    """The TPU compiler (the libtpu wheel) is needed and not installed; the message is one line
    naming what to install. The command line prints it as it is, without a traceback."""


def libtpu_requirement() -> str:
    """The libtpu this svg_lib's `tpu-compile` extra pins ("libtpu==0.0.42.*"), read from the
    installed package's metadata; "libtpu" where that is not available."""
    try:
        requires = metadata.requires("svg_lib") or []
    except metadata.PackageNotFoundError:
        requires = []
    for line in requires:
        if line.replace(" ", "").startswith("libtpu"):
            return line.split(";")[0].strip()
    return "libtpu"


def has_libtpu() -> bool:
    """True when the libtpu wheel (the TPU compiler) is installed."""
    return importlib.util.find_spec("libtpu") is not None


def require_libtpu() -> None:
    """Raise a RuntimeError that says how to install libtpu, if it is missing."""
    if not has_libtpu():
        raise MissingCompiler(missing_compiler_message("compiling for TPU on this machine"))


def missing_compiler_message(what: str) -> str:
    """One line: `what` needs libtpu, which is missing, and the pip command that installs it."""
    return (f"{what} needs the TPU compiler (the libtpu wheel), which is not installed: pip install "
            f"'{libtpu_requirement()}' (the version the installed jax expects), or pip install -e '.[tpu-compile]' "
            "from the repository root")


def allow_shared_libtpu() -> None:
    """Let several processes load libtpu when no TPU is attached (called by `import svg_lib`).

    Must run before jax first initialises its backends in a process, hence at import."""
    # libtpu takes a lock file so that two processes never drive the same TPU chips. With no
    # TPU attached there are no chips to protect, and the lock would only stop a second
    # process (a notebook kernel beside a test run) from compiling. On a TPU host (device
    # files present) the lock stays.
    if not glob.glob("/dev/accel*") and not os.path.isdir("/dev/vfio"):
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        # Without these, libtpu's start-up (when jax first looks for devices) prints several
        # lines of warnings about the TPU slice it cannot find, into every notebook's output.
        # With no TPU attached they name nothing real: jax still falls back to the CPU, and a
        # compile-only topology names its own generation (same compiler verdicts either way).
        os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v6e-1")
        os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")


def libtpu_version() -> str | None:
    """The installed libtpu's version, or None without it."""
    return installed_version("libtpu")
