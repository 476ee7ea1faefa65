#!/usr/bin/env python3
"""Set the repository's URL everywhere a reader meets it, in one command, at publication.

    python tools/set-repository-url.py https://github.com/OWNER/svg-tpu

The URL lives in one file, REPOSITORY_URL at the repository's root ("<repository URL>" until the
series is published). This writes the new URL there, replaces the old value in every markdown file
(the README's and WORKSHOP's `git clone` lines), and then runs tools/set-setup-cell.py on every
notebook, which copies it into tools/setup-cell.py and into each notebook's setup cell (outputs
untouched). Run it again to move the series to another URL. tests/test_repository_url.py and
tests/test_notebook_setup.py check that everything agrees afterwards.
"""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP = {".git", ".venv", ".venv-colab", ".colab", "node_modules", "artifacts"}


def check_url(url: str) -> str:
    url = url.strip()
    if not url or re.search(r"\s|[<>\"']", url) or not re.match(r"(https?://|git@|ssh://|file://|/)", url):
        sys.exit(f"set-repository-url: {url!r} is not a git URL: give the one `git clone` takes, such as "
                 "https://github.com/OWNER/svg-tpu or git@github.com:OWNER/svg-tpu.git")
    return url


def markdown_files() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.md") if not SKIP & set(p.relative_to(ROOT).parts))


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        sys.exit("usage: python tools/set-repository-url.py URL (the URL `git clone` takes)")
    url = check_url(argv[0])
    holder = ROOT / "REPOSITORY_URL"
    old = holder.read_text().strip()
    if url != old:
        for path in markdown_files():
            text = path.read_text()
            if old in text:
                path.write_text(text.replace(old, url))
                print(f"{path.relative_to(ROOT)}: {text.count(old)} x {old} -> {url}")
        holder.write_text(url + "\n")
        print(f"REPOSITORY_URL: {url}")
    notebooks = sorted(str(p) for p in (ROOT / "notebooks").rglob("*.ipynb")
                       if ".ipynb_checkpoints" not in p.parts)
    subprocess.run([sys.executable, str(ROOT / "tools" / "set-setup-cell.py"), *notebooks], check=True)


if __name__ == "__main__":
    main(sys.argv[1:])
