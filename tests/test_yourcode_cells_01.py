"""Notebook 01's your-code cell, the online-softmax tile body on refs inside a given flash kernel: the
checker names typical mistakes, the solution passes, and the notebook runs with a wrong and with a correct
body in the cell (the later cells compare and time the kernel with the learner's body)."""
import jax.numpy as jnp
import pytest

from svg_lib.kernels.forward import MASK_VALUE
from svg_lib.teaching.exercises import p01_tile_body as p01
from yourcode_runner import run_with_pieces

NOTEBOOK = "01_dense_attention.ipynb"


def _body(rescale_acc=True, l_power=1, tile_max=False, store_m=True, use_keep=True, subtract_max=True,
          masked_value=MASK_VALUE, max_axis=1, store_m_first=False, store_l=True, store_acc=True, swap_keep=False,
          flip_alpha=False, p_old_max=False):
    """The tile body with one switch per typical mistake."""
    def body(q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref, keep):
        s = jnp.dot(q_ref[...], k_ref[...].T, preferred_element_type=jnp.float32)
        if keep is not None and use_keep:
            s = jnp.where(keep, masked_value, s) if swap_keep else jnp.where(keep, s, masked_value)
        m_prev = m_ref[...]
        row_max = s.max(axis=max_axis, keepdims=True)
        m_next = row_max if tile_max else jnp.maximum(m_prev, row_max)
        if store_m_first:  # the state written before alpha reads the old max back
            m_ref[...] = m_next
            m_prev = m_ref[...]
        shift = m_next if subtract_max else jnp.zeros_like(m_next)
        alpha = (jnp.exp(m_next - m_prev) if flip_alpha else jnp.exp(m_prev - m_next)) if subtract_max else 1.0
        p = jnp.exp(s - (m_prev if p_old_max else shift))
        if store_l:
            l_ref[...] = alpha ** l_power * l_ref[...] + p.sum(axis=1, keepdims=True)
        if store_acc:
            acc_ref[...] = (alpha if rescale_acc else 1.0) * acc_ref[...] + jnp.dot(p, v_ref[...],
                                                                                    preferred_element_type=jnp.float32)
        if store_m:
            m_ref[...] = m_next
    return body


def _numpy_exp(q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref, keep):    # NumPy on a traced value
    import numpy as np
    s = jnp.dot(q_ref[...], k_ref[...].T, preferred_element_type=jnp.float32)
    m_next = jnp.maximum(m_ref[...], s.max(axis=1, keepdims=True))
    p = np.exp(s - m_next)
    l_ref[...] = l_ref[...] + p.sum(axis=1, keepdims=True)


MISTAKES = {
    "NumPy in the body": (_numpy_exp, "hidden case 1", "use jax.numpy"),
    "acc not rescaled": (_body(rescale_acc=False), "hidden case 2", "acc was not rescaled"),
    "l rescaled twice": (_body(l_power=2), "hidden case 2", "l was rescaled twice"),
    "tile max instead of the running max": (_body(tile_max=True), "scores near 1e4", "the tile's own max is not enough"),
    "m not stored": (_body(store_m=False), "hidden case 1", "m_ref[...] = m_next (else the next tile"),
    "acc not stored": (_body(store_acc=False), "hidden case 1", "part of the state was never written back"),
    "l not stored": (_body(store_l=False), "hidden case 1", "l was never written back"),
    "keep arguments swapped": (_body(swap_keep=True), "fully masked", "keep is True where a pair is kept"),
    "alpha upside down": (_body(flip_alpha=True), "hidden case 1", "alpha is upside down"),
    "p against the old max": (_body(p_old_max=True), "hidden case 1", "p was measured against the old max"),
    "keep ignored": (_body(use_keep=False), "fully masked", "masked pairs counted"),
    "no max subtracted": (_body(subtract_max=False), "scores near 1e4", "exp overflowed"),
    "masked scores set to 0": (_body(masked_value=0.0), "fully masked", "masked scores were set to 0"),
    "max over the wrong axis": (_body(max_axis=0), "hidden case 1", "axis=1 with keepdims=True"),
    "m_ref read after it was written": (_body(store_m_first=True), "hidden case 2", "m_ref was written before alpha"),
}


@pytest.mark.parametrize("name", MISTAKES)
def test_checker_names_the_mistake(name, capsys):
    fn, case, hint = MISTAKES[name]
    result = p01.check_tile_body_on_refs(fn)
    assert not result.passed
    assert case in result.message and hint in result.message, result.message


def test_stub_and_solution():
    def stub(*refs):
        raise NotImplementedError("your code here")

    assert "still the stub" in p01.check_tile_body_on_refs(stub).message
    namespace = {"jnp": jnp, "MASK_VALUE": MASK_VALUE}
    exec(p01.SOLUTION, namespace)
    assert p01.check_tile_body_on_refs(namespace["tile_body"]).passed
    assert len(p01.HINTS.all()) >= 4 and "m_ref[...] = m_next" in p01.HINTS.all()[-1]


WRONG = '''
def tile_body(q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref, keep):
    s = jnp.dot(q_ref[...], k_ref[...].T, preferred_element_type=jnp.float32)
    if keep is not None:
        s = jnp.where(keep, s, MASK_VALUE)
    m_next = jnp.maximum(m_ref[...], s.max(axis=1, keepdims=True))
    alpha = jnp.exp(m_ref[...] - m_next)
    p = jnp.exp(s - m_next)
    l_ref[...] = alpha * l_ref[...] + p.sum(axis=1, keepdims=True)
    acc_ref[...] = acc_ref[...] + jnp.dot(p, v_ref[...], preferred_element_type=jnp.float32)  # not rescaled
    m_ref[...] = m_next
'''

COUNTED = '''
SHAPES = []  # q_ref's shape at every trace of the body: the checker's tiles, then the notebook's


def tile_body(q_ref, k_ref, v_ref, m_ref, l_ref, acc_ref, keep):
    SHAPES.append(tuple(q_ref.shape))
    s = jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    s = s if keep is None else jnp.where(keep, s, MASK_VALUE)
    m_prev, m_next = m_ref[...], jnp.maximum(m_ref[...], jnp.max(s, axis=1, keepdims=True))
    p, alpha = jnp.exp(s - m_next), jnp.exp(m_prev - m_next)
    m_ref[...] = m_next
    l_ref[...] = l_ref[...] * alpha + jnp.sum(p, axis=1, keepdims=True)
    acc_ref[...] = acc_ref[...] * alpha + jnp.dot(p.astype(v_ref.dtype), v_ref[...], preferred_element_type=jnp.float32)
'''


def test_notebook_with_a_wrong_body_says_not_yet():
    texts = run_with_pieces(NOTEBOOK, {0: WRONG}, stop_after=1)["outputs"]
    verdict = texts[-1]
    assert "not yet" in verdict and "acc was not rescaled" in verdict
    assert "The cells below run svg_lib's tile body" in verdict


def test_notebook_runs_the_learners_body():
    run = run_with_pieces(NOTEBOOK, {0: COUNTED}, probe="print((config.block_q, config.head_dim) in SHAPES)")
    assert any("The cells below run your tile body" in t for t in run["outputs"])
    assert any("the kernel with your tile body" in t and "matches reference_attention" in t for t in run["outputs"])
    assert run["probe"].strip() == "True", run["probe"]  # the kernel at the knobs' tiles traced the learner's body


def test_the_given_kernel_compiles_for_a_tpu(tpu_compiler):
    """With svg_lib's body, the kernel the learner's body runs in compiles for a v6e (compile-only: the
    Mosaic compiler checks the [block_q, 1] views of the state, the transposed k and VMEM), at the
    walkthrough's tiles."""
    import functools

    kernel = functools.partial(p01.flash_attention_with_body, body=p01.tile_body, block_q=256, block_kv=128,
                               interpret=False)
    compiled, _ = tpu_compiler.compile_fn(kernel, [((1, 2520, 128), "bfloat16")] * 3, target="v6e")
    assert compiled is not None
