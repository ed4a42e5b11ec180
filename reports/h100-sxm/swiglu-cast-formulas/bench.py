# Times fp8kernels.swiglu_cast's axiswise and blockwise casts with each variant kernel; counts h's mismatches
# against eager's silu(gate) * up.
import importlib.util, pathlib, sys, torch
import fp8kernels.swiglu_cast as sc
from fp8kernels.quantize import QuantizeSpec
torch.manual_seed(0)
gu = (3 * torch.randn(8192, 28672, device="cuda")).to(torch.bfloat16)
spec = QuantizeSpec(torch.float8_e4m3fn, False, rowwise=True, columnwise=True)
h_ref = sc.swiglu_reference(gu)
def timed(fn, n=20):
    for _ in range(3): fn()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(n):
        s.record(); fn(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    ts.sort(); return ts[n // 2]
for path in sorted(pathlib.Path(".dev/swv").glob("v*.py")):
    spec_m = importlib.util.spec_from_file_location(path.stem, path); mod = importlib.util.module_from_spec(spec_m); spec_m.loader.exec_module(mod)
    sc._swiglu_cast_kernel = mod._swiglu_cast_kernel
    ax = timed(lambda: sc.swiglu_cast_axiswise(gu, spec)); bw = timed(lambda: sc.swiglu_cast_blockwise(gu, spec))
    q = sc.swiglu_cast_blockwise(gu, spec)
    # h's bits through the blockwise copy are not comparable; compare the AMAX pass's row amaxes with eager's
    row, col = sc.swiglu_amax(gu)
    mism = (row != h_ref.float().abs().amax(dim=1)).float().mean().item()
    print(f"{path.stem:22s} axiswise {ax:.3f} ms  blockwise {bw:.3f} ms  row-amax mismatch {100*mism:.3f}%", flush=True)
