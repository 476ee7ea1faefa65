"""The install routes agree with each other and with the README.

Three files say what the series runs on:

* pyproject.toml: runtime dependencies plus the `lab` extra (`make lab`: the learner's setup, no
  libtpu) and the `dev` extra (`make test`), which adds the test tools and pulls in the
  `tpu-compile` extra (libtpu, the TPU compiler) by naming svg-lib[tpu-compile];
* environment.yml: the conda route;
* binder/environment.yml + binder/postBuild: the Binder (repo2docker) route.

Both environment files are learners' setups: they must list exactly the packages of
`pyproject.toml` (runtime + lab)
with the same version specifiers, the same Python, and jax/jaxlib pinned together. The
comparison is a plain function, so the tests also feed it a drifted copy to show it fails.

The environment files are read with a small parser for the YAML subset they use (no PyYAML
dependency); when PyYAML happens to be installed it cross-checks the parser.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

import tomllib  # Python >= 3.11, which the dev extra (jax==0.10.2) needs anyway
from importlib import metadata

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
CONDA_ENV = ROOT / "environment.yml"
BINDER_ENV = ROOT / "binder" / "environment.yml"
POSTBUILD = ROOT / "binder" / "postBuild"
JAX_PAIR = ("jax", "jaxlib")


# --- a parser for the YAML subset of conda environment files -------------------------------

def _strip_comment(line: str) -> str:
    # A '#' starts a comment at the line start or after whitespace (YAML's rule).
    match = re.search(r"(^|\s)#", line)
    return line[:match.start()] if match else line


def _scalar(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def _parse_list(lines, i, parent_indent):
    items, item_indent = [], None
    while i < len(lines) and lines[i][0] > parent_indent:
        indent, body, number = lines[i]
        item_indent = indent if item_indent is None else item_indent
        if indent != item_indent or not (body == "-" or body.startswith("- ")):
            raise ValueError(f"line {number}: expected a '- item' at indent {item_indent}, got {body!r}")
        entry = body[1:].strip()
        i += 1
        if entry.endswith(":"):  # a nested list such as "- pip:"
            sub, i = _parse_list(lines, i, indent)
            items.append({entry[:-1].strip(): sub})
        else:
            items.append(_scalar(entry))
    return items, i


def parse_conda_env(text: str) -> dict:
    """Parse the subset of YAML that conda environment files here use.

    Top-level `key: value` scalars and `key:` lists of scalars, where a list item may be a
    one-key mapping holding another list (`- pip:`). Anything else raises ValueError, so a
    file that outgrows the subset is reported instead of misread.
    """
    lines = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = _strip_comment(raw).rstrip()
        if line.strip():
            if "\t" in line[:len(line) - len(line.lstrip())]:
                raise ValueError(f"line {number}: tabs are not allowed in YAML indentation")
            lines.append((len(line) - len(line.lstrip()), line.strip(), number))
    result, i = {}, 0
    while i < len(lines):
        indent, body, number = lines[i]
        key, colon, value = body.partition(":")
        if indent != 0 or not colon or body.startswith("-"):
            raise ValueError(f"line {number}: expected a top-level 'key:' line, got {body!r}")
        i += 1
        if value.strip():
            result[key.strip()] = _scalar(value.strip())
        else:
            result[key.strip()], i = _parse_list(lines, i, 0)
    return result


# --- what each file says -------------------------------------------------------------------

def load_pyproject(text: str) -> dict:
    return tomllib.loads(text)


def conda_python(env: dict, label: str) -> str:
    """The `python=X.Y` pin of a conda environment, as 'X.Y'."""
    pins = [d for d in env.get("dependencies", []) if isinstance(d, str) and re.match(r"python\b", d)]
    assert len(pins) == 1, f"{label}: expected one 'python=X.Y' dependency, found {pins}"
    match = re.fullmatch(r"python\s*=+\s*(\d+\.\d+)(\.\*)?", pins[0])
    assert match, f"{label}: python should be pinned as 'python=X.Y', got {pins[0]!r}"
    return match.group(1)


def conda_pip(env: dict, label: str):
    """(requirements by canonical name, option lines such as '-e .') of the pip section."""
    sections = [d["pip"] for d in env.get("dependencies", []) if isinstance(d, dict) and "pip" in d]
    assert len(sections) == 1, f"{label}: expected one '- pip:' section, found {len(sections)}"
    requirements, options = {}, []
    for line in sections[0]:
        if line.startswith("-"):
            options.append(line)
            continue
        req = Requirement(line)
        name = canonicalize_name(req.name)
        assert name not in requirements, f"{label}: {req.name} is listed twice"
        requirements[name] = req
    return requirements, options


def extra_requirements(pyproject: dict, extra: str, seen=()) -> list[str]:
    """The requirement lines of an extra, with the project's own extras it names expanded
    (`svg-lib[tpu-compile]` in `dev` stands for the tpu-compile extra's lines)."""
    project = canonicalize_name(pyproject["project"]["name"])
    extras = pyproject["project"]["optional-dependencies"]
    assert extra in extras, f"pyproject.toml has no [{extra}] extra (has {', '.join(extras)})"
    lines = []
    for line in extras[extra]:
        req = Requirement(line)
        if canonicalize_name(req.name) != project:
            lines.append(line)
            continue
        for sub in sorted(req.extras):
            assert sub not in seen, f"extras of {project} include each other: {seen + (sub,)}"
            lines.extend(extra_requirements(pyproject, sub, seen + (extra,)))
    return lines


def expected_requirements(pyproject: dict, python_version: str, extra: str = "lab") -> dict:
    """Runtime dependencies overlaid with an extra (`lab` by default), for an environment on `python_version`.

    An extra's entry replaces the runtime entry of the same package (jax>=0.7.2 becomes jax==0.10.2);
    the project's own extras that dev names are expanded. Entries whose marker excludes that
    Python (tomli on 3.11+) are left out.
    """
    marker_env = {"python_version": python_version, "python_full_version": python_version + ".0"}
    expected = {}
    for line in pyproject["project"]["dependencies"] + extra_requirements(pyproject, extra):
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(marker_env):
            expected[canonicalize_name(req.name)] = req
    return expected


def disagreements(pyproject: dict, env: dict, label: str) -> list[str]:
    """Every way a conda environment file differs from pyproject.toml (empty when they agree)."""
    problems = []
    python = conda_python(env, label)
    if python + ".0" not in SpecifierSet(pyproject["project"]["requires-python"]):
        problems.append(f"{label}: python={python} is outside requires-python "
                        f"{pyproject['project']['requires-python']}")
    expected = expected_requirements(pyproject, python)
    listed, _ = conda_pip(env, label)
    for name in sorted(expected.keys() - listed.keys()):
        problems.append(f"{label}: missing {expected[name]} (pyproject.toml has it)")
    for name in sorted(listed.keys() - expected.keys()):
        problems.append(f"{label}: lists {listed[name]}, which pyproject.toml does not")
    for name in sorted(expected.keys() & listed.keys()):
        want, got = expected[name], listed[name]
        if want.specifier != got.specifier or want.extras != got.extras:
            problems.append(f"{label}: has {got}, pyproject.toml says {want}")
    return problems


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def pyproject():
    return load_pyproject(read(PYPROJECT))


# --- the tests ------------------------------------------------------------------------------

def installed_pinned_jax(pyproject):
    """The installed jax's metadata, skipping the test unless it is the dev extra's pinned version."""
    pinned = next(iter(expected_requirements(pyproject, "3.11")["jax"].specifier)).version
    try:
        installed = metadata.metadata("jax")
    except metadata.PackageNotFoundError:
        pytest.skip("jax is not installed")
    if installed["Version"] != pinned:
        pytest.skip(f"installed jax {installed['Version']} is not the pinned {pinned}")
    return installed


def test_lab_and_dev_extras_pin_jax_and_jaxlib_to_one_version(pyproject):
    lab = expected_requirements(pyproject, "3.11", "lab")
    assert {n: str(r) for n, r in lab.items() if n in JAX_PAIR} == \
        {n: str(r) for n, r in expected_requirements(pyproject, "3.11", "dev").items() if n in JAX_PAIR}
    dev = lab
    versions = []
    for name in JAX_PAIR:
        specs = list(dev[name].specifier)
        assert len(specs) == 1 and specs[0].operator == "==", f"dev extra should pin {name}==X.Y.Z, has {dev[name]}"
        versions.append(specs[0].version)
    assert versions[0] == versions[1], f"jax and jaxlib are released together; dev pins {versions}"


def test_runtime_jax_is_a_lower_bound_that_admits_the_pin(pyproject):
    # Colab's TPU runtime ships its own jax: pip leaves it alone only if the runtime
    # requirement has no upper bound or exact pin that could exclude it.
    runtime = {canonicalize_name(Requirement(r).name): Requirement(r) for r in pyproject["project"]["dependencies"]}
    operators = {spec.operator for spec in runtime["jax"].specifier}
    assert operators == {">="}, f"runtime jax must be a lower bound only, got {runtime['jax']}"
    assert "jaxlib" not in runtime, "jaxlib comes with jax; pinning it at runtime would fight Colab's"
    pinned = expected_requirements(pyproject, "3.11")["jax"]
    assert next(iter(pinned.specifier)).version in runtime["jax"].specifier


def test_dev_extra_installs_the_tpu_compiler_pinned_as_jax_tpu_pins_it(pyproject):
    # libtpu must match the jax driving it: the tpu-compile extra pins what jax[tpu] declares.
    libtpu = [Requirement(r) for r in pyproject["project"]["optional-dependencies"]["tpu-compile"]]
    assert [canonicalize_name(r.name) for r in libtpu] == ["libtpu"], libtpu
    assert "libtpu" in expected_requirements(pyproject, "3.11", "dev"), "the dev extra should pull in svg-lib[tpu-compile]"
    # libtpu has wheels for Linux x86_64 only: a learner's laptop (a Mac) must never need it
    assert "libtpu" not in expected_requirements(pyproject, "3.11", "lab"), "the lab extra must not pull in libtpu"
    installed = installed_pinned_jax(pyproject)
    declared = [Requirement(r) for r in installed.get_all("Requires-Dist") or []]
    declared = [r for r in declared if canonicalize_name(r.name) == "libtpu" and r.marker is not None
                and r.marker.evaluate({"extra": "tpu"})]
    assert declared, f"jax {installed['Version']} declares no libtpu for its [tpu] extra"
    assert {str(r.specifier) for r in declared} == {str(libtpu[0].specifier)}, \
        f"jax[tpu]=={installed['Version']} wants {declared[0].specifier}, the tpu-compile extra pins {libtpu[0].specifier}"


@pytest.mark.parametrize("path", [CONDA_ENV, BINDER_ENV], ids=["environment.yml", "binder/environment.yml"])
def test_environment_file_matches_pyproject(pyproject, path):
    label = str(path.relative_to(ROOT))
    assert disagreements(pyproject, parse_conda_env(read(path)), label) == []


def test_both_environments_use_the_same_python():
    assert conda_python(parse_conda_env(read(CONDA_ENV)), "environment.yml") == \
        conda_python(parse_conda_env(read(BINDER_ENV)), "binder/environment.yml")


def test_comparison_reports_drift(pyproject):
    # The check above must be able to fail: drift the binder file three ways.
    drifted = read(BINDER_ENV)
    for pattern, replacement in [(r"(?m)^(\s*- )jax==\S+$", r"\1jax==0.10.1"),
                                 (r"(?m)^\s*- jupyterlab\s*\n", "      - jupyterlab\n      - libtpu==0.0.42.*\n"),
                                 (r"(?m)^\s*- matplotlib\S*\s*\n", ""),
                                 (r"(?m)^(\s*- )python=\S+$", r"\1python=3.9")]:
        drifted, count = re.subn(pattern, replacement, drifted)
        assert count == 1, f"binder/environment.yml no longer has a line matching {pattern!r}"
    problems = disagreements(pyproject, parse_conda_env(drifted), "drifted")
    assert any("jax==0.10.1" in p for p in problems), problems
    assert any("missing matplotlib" in p for p in problems), problems
    assert any("lists libtpu" in p for p in problems), problems
    assert any("python=3.9" in p for p in problems), problems


def make_min_python() -> str:
    match = re.search(r"(?m)^MIN_PYTHON\s*:?=\s*(\d+\.\d+)\s*$", read(ROOT / "Makefile"))
    assert match, "Makefile should set MIN_PYTHON := X.Y (the Python the dev setup needs)"
    return match.group(1)


def test_python_minimum_is_stated_consistently():
    minimum = make_min_python()
    stated = f"python3 >= {minimum}" in read(ROOT / "README.md")
    assert stated, f"README's prerequisite should say python3 >= {minimum}, as the Makefile checks"
    for path in (CONDA_ENV, BINDER_ENV):
        python = conda_python(parse_conda_env(read(path)), path.name)
        assert Version(python) >= Version(minimum), f"{path}: python={python} is below MIN_PYTHON {minimum}"


def test_pinned_jax_accepts_the_minimum_python(pyproject):
    # Installing the dev extra on a Python the pinned jax refuses fails with a long pip
    # error; MIN_PYTHON exists to say it first. Checked against the installed jax's metadata.
    installed = installed_pinned_jax(pyproject)
    requires = SpecifierSet(installed["Requires-Python"] or "")
    assert make_min_python() + ".0" in requires, \
        f"jax {installed['Version']} requires Python {requires}; raise MIN_PYTHON in the Makefile and README"


def test_conda_environment_installs_this_checkout():
    _, options = conda_pip(parse_conda_env(read(CONDA_ENV)), "environment.yml")
    assert any(re.fullmatch(r"-e\s+\.(\[(dev|lab)\])?", o) for o in options), \
        f"environment.yml's pip section should end with '-e .' to install svg_lib; options: {options}"


def test_binder_postbuild_installs_the_repo():
    lines = [ln.strip() for ln in read(POSTBUILD).splitlines()]
    code = [ln for ln in lines if ln and not ln.startswith("#")]
    assert lines[0].startswith("#!"), "postBuild needs a shebang: repo2docker executes it"
    assert re.fullmatch(r"set -[a-z]*e[a-z]*( -o pipefail)?", code[0]), \
        f"postBuild should start with 'set -e' so a failed install fails the build, starts with {code[0]!r}"
    assert any(re.search(r"pip install\b.*-e\s+[\"']?\.(\[(dev|lab)\])?[\"']?(\s|$)", ln) for ln in code), \
        "postBuild should pip-install the repository (-e .)"
    assert os.access(POSTBUILD, os.X_OK), "binder/postBuild must be executable (chmod +x)"


def test_parser_agrees_with_pyyaml_when_available():
    yaml = pytest.importorskip("yaml", reason="PyYAML not installed; the cross-check is optional")
    for path in (CONDA_ENV, BINDER_ENV):
        assert parse_conda_env(read(path)) == yaml.safe_load(read(path)), path


def test_parser_rejects_what_it_does_not_understand():
    with pytest.raises(ValueError, match="line 3"):
        parse_conda_env("dependencies:\n  - pip:\n      pip: {a: 1}\n")
    with pytest.raises(ValueError, match="line 1"):
        parse_conda_env("  indented: at top level\n")


def test_readme_quick_start_is_make_lab_and_make_test():
    readme = read(ROOT / "README.md")
    section = re.search(r"(?ms)^## Quick start\s*$(.*?)(?=^## )", readme)
    assert section, "README.md needs a '## Quick start' section"
    block = re.search(r"```[a-z]*\n(.*?)```", section.group(1), flags=re.S)
    assert block, "the Quick start section needs a code block with the commands"
    commands = [ln.strip() for ln in block.group(1).splitlines() if ln.strip() and not ln.strip().startswith("#")]
    assert commands == ["make lab", "make test"]
    makefile = read(ROOT / "Makefile")
    for target in ("lab", "test"):
        assert re.search(rf"(?m)^{target}:", makefile), f"Makefile has no '{target}' target"


def test_readme_notebook_table_matches_notebooks_folder():
    # the numbered notebooks, and the appendix the numbered ones point to (A_appendix)
    rows = re.findall(r"(?m)^\| `(\d\d_\w+|A_\w+)` \|.*\| (\w+) \|\s*$", read(ROOT / "README.md"))
    assert rows, "README.md should have a notebook table with a status column"
    available = {name for name, status in rows if status == "available"}
    present = {p.stem for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert present <= {name for name, _ in rows}, \
        f"notebooks missing from the README table: {sorted(present - {name for name, _ in rows})}"
    assert available == present, \
        f"README marks {sorted(available)} available, notebooks/ holds {sorted(present)}: update the status column"


def test_ci_runs_the_readme_test_command():
    script = read(ROOT / ".ci" / "run")
    code = [ln.strip() for ln in script.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    assert "set -euo pipefail" in code
    assert code[-1] == "make test", f".ci/run should end by running 'make test', ends with {code[-1]!r}"


def test_pytest_options_name_files_that_exist(pyproject):
    for option in pyproject["tool"]["pytest"]["ini_options"]["addopts"]:
        if option.startswith("--nbval-sanitize-with="):
            assert (ROOT / option.split("=", 1)[1]).is_file(), option


def test_sanitize_patterns_hide_addresses_only():
    from nbval.plugin import get_sanitize_patterns

    patterns = get_sanitize_patterns(read(ROOT / "tests" / "nbval_sanitize.cfg"))
    assert patterns, "tests/nbval_sanitize.cfg holds no 'regex:'/'replace:' pairs"

    def sanitize(text):
        for regex, replace in patterns:
            text = re.sub(regex, replace, text)
        return text

    a = "<svg_lib.core.masks.Mask object at 0x7f3c2a1b9d50>"
    b = "<svg_lib.core.masks.Mask object at 0x55d0e1a2c3f0>"
    assert sanitize(a) == sanitize(b) != a
    for text in ("mask id 0x7f3c", "tokens = 75600", "<Figure size 640x480 with 1 Axes>"):
        assert sanitize(text) == text


def test_make_test_runs_the_colab_replica_at_the_floor_pyproject_and_readme_state(pyproject):
    # The floor is tested, not assumed: it is the jax of Colab's TPU runtime, which `make test`
    # replicates at the end (`make test-colab`, from tools/colab-tpu-runtime.txt), and the README
    # names it.
    runtime = {canonicalize_name(Requirement(r).name): Requirement(r) for r in pyproject["project"]["dependencies"]}
    floor = next(iter(runtime["jax"].specifier)).version
    colab = dict(re.findall(r"(?m)^([A-Za-z0-9_.-]+)==(\S+)$", read(ROOT / "tools" / "colab-tpu-runtime.txt")))
    assert colab.get("jax") == floor, f"pyproject's floor jax>={floor}, Colab's recorded jax {colab.get('jax')}"
    recipe = re.search(r"(?ms)^test:.*?(?=^\S)", read(ROOT / "Makefile"))
    assert recipe and "test-colab" in recipe.group(0), "make test should run the Colab replica (test-colab)"
    assert f"`jax>={floor}`" in read(ROOT / "README.md"), f"README should name the tested floor jax>={floor}"
    assert f"jax {floor}" in read(ROOT / "WORKSHOP.md"), f"WORKSHOP.md should name the tested floor jax {floor}"


def test_import_time_floors_agree_with_pyproject(pyproject):
    from svg_lib.environment import FLOORS

    runtime = {canonicalize_name(Requirement(r).name): Requirement(r) for r in pyproject["project"]["dependencies"]}
    stated = {name: next(iter(req.specifier)).version for name, req in runtime.items()}
    assert stated == FLOORS, f"pyproject.toml's dependencies {stated}, svg_lib/environment.py's FLOORS {FLOORS}"


def test_import_check_names_the_package_and_the_fix():
    from svg_lib.environment import FLOORS, check_environment, problems, version_tuple

    assert version_tuple("0.7.2") == (0, 7, 2) and version_tuple("2.1.3+cpu") == (2, 1, 3)
    assert version_tuple("0.10.0rc1") == (0, 10, 0) and version_tuple("0.10.2") > version_tuple("0.7.2")

    def installed(old=None, missing=None):
        def version(name):
            if name == missing:
                raise metadata.PackageNotFoundError(name)
            return {"jax": "0.6.2"}.get(name, "99.0") if name == old else "99.0"
        return version

    assert problems(installed()) == []
    check_environment(installed())  # nothing to say, nothing raised
    with pytest.raises(ImportError, match=r"jax 0\.6\.2 is older.*jax>=0\.7\.2.*pip install \"jax>=0\.7\.2\""):
        check_environment(installed(old="jax"))
    with pytest.raises(ImportError, match=r"numpy is not installed.*pip install \"numpy>=2\.1\""):
        check_environment(installed(missing="numpy"))
    # only what is missing is named: no jax upgrade, no TPU runtime, when only a plotting package is absent
    for missing in ("matplotlib", "ipywidgets"):
        with pytest.raises(ImportError) as err:
            check_environment(installed(missing=missing))
        message = str(err.value)
        assert message == (f"svg_lib cannot start: {missing} is not installed (svg_lib needs {missing}>="
                           f"{FLOORS[missing]}). Run: pip install \"{missing}>={FLOORS[missing]}\" (then restart "
                           "the kernel).")
        assert "jax" not in message and "TPU" not in message
    with pytest.raises(ImportError, match=r"jax\[tpu\]>=0\.7\.2\" \"numpy>=2\.1\""):
        check_environment(lambda name: {"jax": "0.6.2", "numpy": "1.26"}.get(name, "99.0"))
