# Setup: make svg_lib importable without installing or upgrading any package (the runtime's own jax,
# on a Colab TPU the one built for its TPU, is the one the series uses). Where svg_lib imports (make lab,
# a pip install) this does nothing; otherwise it puts a clone of the repository found here, above, in the
# folders here or in /content/* on the path, or clones SVG_LIB_REPO here first (on Colab: the repository).
import importlib.util, os, pathlib, subprocess, sys

REPOSITORY_URL = "<repository URL>"  # the file REPOSITORY_URL; python tools/set-repository-url.py URL sets both
_PUBLISHED = not REPOSITORY_URL.startswith("<")  # "<repository URL>": a copy not published yet
SVG_LIB_REPO = os.environ.get("SVG_LIB_REPO", REPOSITORY_URL if _PUBLISHED and "google.colab" in sys.modules else "")
if importlib.util.find_spec("svg_lib") is None:
    _here = pathlib.Path.cwd().resolve()
    _places = [_here, *_here.parents, *sorted(_here.glob("*/")), *sorted(pathlib.Path("/content").glob("*/"))]
    _root = next((p for p in _places if (p / "svg_lib" / "__init__.py").is_file()), None)
    if _root is None and SVG_LIB_REPO:
        _root = _here / pathlib.Path(SVG_LIB_REPO.rstrip("/")).stem
        _git = subprocess.run(["git", "clone", "--depth=1", SVG_LIB_REPO, str(_root)], capture_output=True, text=True)
        if _git.returncode != 0:
            raise RuntimeError(f"git could not clone {SVG_LIB_REPO}: {_git.stderr.strip()}\nClone the repository "
                               "yourself, or set SVG_LIB_REPO in this cell to its git URL, then run this cell again.")
    if _root is None and not _PUBLISHED:
        raise RuntimeError(f"svg_lib does not import and no clone of its repository was found from {_here}, and this "
                           "copy has no repository URL yet: clone the series yourself and open the notebook from it "
                           "(or set SVG_LIB_REPO in this cell to its git URL), or run `python "
                           "tools/set-repository-url.py URL` before publishing.")
    if _root is None:
        raise RuntimeError(f"svg_lib does not import and no clone of its repository was found from {_here}. "
                           f"Clone it (!git clone {REPOSITORY_URL} svg-tpu), or set SVG_LIB_REPO in this cell "
                           "to its git URL, then run this cell again.")
    sys.path.insert(0, str(_root))  # this kernel; PYTHONPATH below for `!python -m svg_lib ...`
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_root), os.environ.get("PYTHONPATH")]))
import svg_lib  # names any package that is missing or older than svg_lib needs, and what to run
