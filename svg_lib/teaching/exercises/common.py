"""What every exercise's checker shares: the verdict (`CheckResult`), hidden cases (`_Case`), the
first failure (`_Fail`), running the learner's code (`_call`, `_learner_exception`), running the
cases and printing the verdict (`_finish`, `_show`), and numbers in messages (`_fmt`)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class CheckResult:
    """The verdict of one checker: `passed`, and a `message` saying why (printed when checked)."""

    exercise: str
    passed: bool
    message: str
    cases: int = 0  # hidden cases run (up to and including the first failure)

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"CheckResult({self.exercise!r}, passed={self.passed}, cases={self.cases})"


class _Fail(Exception):
    """Raised inside a checker to stop at the first failing case (never escapes a checker)."""

    def __init__(self, detail: str, hint: str = ""):
        super().__init__(detail)
        self.detail, self.hint = detail, hint


@dataclass
class _Case:
    name: str
    data: dict = field(default_factory=dict)


def _learner_exception(what: str, exc: BaseException, hints: dict | None = None) -> _Fail:
    kind = type(exc).__name__
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    if isinstance(exc, NotImplementedError):
        return _Fail(f"{what} raised NotImplementedError{': ' + first if first else ''}",
                     "this is still the stub: replace the `raise NotImplementedError` line with your code")
    hint = ""
    for name, h in (hints or {}).items():
        if name in kind or name in first:
            hint = h
            break
    return _Fail(f"{what} raised {kind}: {first}", hint or "read the error above: it comes from your code, "
                 "on the inputs this case describes")


def _call(fn, what: str, *args, hints: dict | None = None, **kwargs):
    try:
        return fn(*args, **kwargs)
    except _Fail:  # the checker's own verdict on what the learner's code returned: said as it is
        raise
    except Exception as exc:  # anything the learner's code raises is a failed case, not a crash
        raise _learner_exception(what, exc, hints) from None


def _finish(exercise: str, cases, run_case, summary: str) -> CheckResult:
    """Run `run_case(case)` over `cases`, stop at the first failure, print and return the verdict."""
    done = 0
    total = len(cases)
    for index, case in enumerate(cases, start=1):
        done = index
        try:
            run_case(case)
        except _Fail as fail:
            lines = [f"not yet: {exercise} fails hidden case {index} of {total}: {case.name}.",
                     f"  {fail.detail}"]
            if fail.hint:
                lines.append(f"  hint: {fail.hint}")
            return _show(CheckResult(exercise, False, "\n".join(lines), done))
        except Exception as exc:  # a result so odd that checking it failed: still the learner's verdict
            message = (f"not yet: {exercise} fails hidden case {index} of {total}: {case.name}.\n"
                       f"  checking your result raised {type(exc).__name__}: {exc}\n"
                       "  hint: return exactly the types and shapes the contract above describes")
            return _show(CheckResult(exercise, False, message, done))
    return _show(CheckResult(exercise, True, f"passed: {exercise}: all {total} hidden cases ({summary}).", done))


def _show(result: CheckResult) -> CheckResult:
    print(result.message)
    return result


def _fmt(x, digits: int = 4) -> str:
    """A short rendering of a number or a small array for messages."""
    a = np.asarray(x)
    if a.ndim == 0:
        v = a.item()
        return f"{v:.{digits}g}" if isinstance(v, float) else str(v)
    flat = a.ravel()
    shown = ", ".join(_fmt(v, digits) for v in flat[:6])
    return f"[{shown}{', ...' if flat.size > 6 else ''}]"
