"""How the series' figures were made, kept apart from the lesson: nothing in the lesson's core (core/,
methods, problem, runtime, memory/, kernels/, attention) imports this package (an import-linter contract).

`tpu/`: TPU tooling that needs no TPU (lowering, the compile-only compiler, its errors, the estimate-vs-
compiler checks, the sharded programs, the cost probes and the cost model built on them).
`tools/`: what measures on this machine (bench, tuner), the report a TPU owner sends, the frontier.
`adversarial`: inputs chosen to break a fixed softmax max.
"""
