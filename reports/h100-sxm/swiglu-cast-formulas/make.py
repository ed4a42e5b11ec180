# Writes variant copies of kernels/_swiglu_cast.py with other silu/rounding formulas (run from the repo root).
import re, pathlib
src = pathlib.Path("kernels/_swiglu_cast.py").read_text()
old = "    silu = rounded(tl.math.div_rn(g, 1.0 + torch_exp(-g)), gate)  # torch's silu: a correctly rounded division\n    return rounded(silu * up.to(tl.float32), gate)"
assert old in src
bits = '''
@triton.jit
def _bits(x, like):
    if like.dtype == tl.bfloat16:
        b = x.to(tl.uint32, bitcast=True)
        b = (b + (0x7FFF + ((b >> 16) & 1))) & 0xFFFF0000
        return b.to(tl.float32, bitcast=True)
    return x.to(like.dtype).to(tl.float32)

'''
variants = {
    "v0_bits_texp_div": "    silu = _bits(g / (1.0 + tl.exp(-g)), gate)\n    return _bits(silu * up.to(tl.float32), gate)",
    "v1_instr_expf_divrn": old,
    "v2_instr_texp_div": "    silu = rounded(g / (1.0 + tl.exp(-g)), gate)\n    return rounded(silu * up.to(tl.float32), gate)",
    "v3_instr_expf_div": "    silu = rounded(g / (1.0 + torch_exp(-g)), gate)\n    return rounded(silu * up.to(tl.float32), gate)",
    "v4_instr_texp_divrn": "    silu = rounded(tl.math.div_rn(g, 1.0 + tl.exp(-g)), gate)\n    return rounded(silu * up.to(tl.float32), gate)",
}
for name, body in variants.items():
    text = src.replace(old, body).replace("@triton.jit\ndef _swiglu_tile", bits + "@triton.jit\ndef _swiglu_tile", 1)
    pathlib.Path(f".dev/swv/{name}.py").write_text(text)
