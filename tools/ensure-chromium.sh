#!/usr/bin/env bash
# Make sure Debian's Chromium is at /usr/bin/chromium, for tests/test_browser.py (run by `make test`).
#
# The browser test drives this system Chromium with Playwright; it never downloads a browser of
# its own (`playwright install`). Installing needs root and apt-get (Debian, or an image based on
# it). Anywhere else this prints a note and succeeds: the browser test then skips itself, except
# when the CI environment variable is set, where a missing browser fails the test.
set -euo pipefail

CHROMIUM=/usr/bin/chromium

if [ -x "$CHROMIUM" ]; then
  exit 0
fi

if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "make: $CHROMIUM is missing; installing Debian's chromium for the browser test:"
  echo "  apt-get update && apt-get install -y --no-install-recommends chromium"
  export DEBIAN_FRONTEND=noninteractive
  if apt-get update && apt-get install -y --no-install-recommends chromium && [ -x "$CHROMIUM" ]; then
    echo "make: installed $("$CHROMIUM" --version 2>/dev/null || echo chromium)"
  else
    echo "make: could not install chromium with apt-get (no network, or no 'chromium' package in this" \
         "distribution); tests/test_browser.py will be skipped (or fail, when CI is set)." >&2
  fi
else
  echo "make: note: $CHROMIUM is missing and installing it needs root and apt-get;" \
       "tests/test_browser.py will be skipped (it fails when CI is set)."
fi
