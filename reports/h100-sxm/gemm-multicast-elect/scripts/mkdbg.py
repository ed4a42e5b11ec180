"""Refresh .dev/dbg/fp8kernels from kernels/ and add env switches: WAIT (spin|try|try:NS), DBG_MC, DBG_PEER."""
import pathlib, shutil, re
root = pathlib.Path("/work/main")
dst = root / ".dev/dbg/fp8kernels"
shutil.rmtree(dst, ignore_errors=True)
shutil.copytree(root / "kernels", dst, ignore=shutil.ignore_patterns("__pycache__"))
p = dst / "_gemm_ws.py"
s = p.read_text()
start = s.index('_SPIN_WAIT_PTX = gl.constexpr("""{')
end = s.index('""")', start) + 4
s = s[:start] + '''_WAIT = __import__("os").environ.get("WAIT", "spin")
_WAIT_OP = "test_wait" if _WAIT == "spin" else "try_wait"
_WAIT_HINT = (", " + _WAIT.split(":")[1]) if ":" in _WAIT else ""
_SPIN_WAIT_PTX = gl.constexpr("""{
.reg .pred %sw;
.reg .b32 %swa;
mov.u32 %swa, global_smem;
add.u32 %swa, %swa, $1;
spin_wait_${:uid}:
mbarrier.""" + _WAIT_OP + """.parity.shared::cta.b64 %sw, [%swa], $2""" + _WAIT_HINT + """;
@!%sw bra spin_wait_${:uid};
mov.u32 $0, 0;
}""")''' + s[end:]
s = s.replace('ADDRESSED = ("b_bufs", "ready", "empty")', 'DBG_MC = gl.constexpr(__import__("os").environ.get("DBG_MC", "1") == "1")\nDBG_PEER = gl.constexpr(__import__("os").environ.get("DBG_PEER", "1") == "1")\nADDRESSED = ("b_bufs", "ready", "empty")', 1)
old = '''    if gl.num_ctas() == 2:
        HALF_ROWS: gl.constexpr = BLOCK_N // 2'''
assert old in s; s = s.replace(old, old.replace("== 2:", "== 2 and DBG_MC:"))
old = '''    if gl.num_ctas() == 2:
        arrive_peer('''
assert old in s; s = s.replace(old, old.replace("== 2:", "== 2 and DBG_PEER:"))
old = "count=CONSUMERS * (1 + PEER_ARRIVALS * (gl.num_ctas() - 1)))"
assert old in s; s = s.replace(old, "count=CONSUMERS * (1 + PEER_ARRIVALS * (gl.num_ctas() - 1) * DBG_PEER))")
p.write_text(s)
print("dbg copy refreshed")
