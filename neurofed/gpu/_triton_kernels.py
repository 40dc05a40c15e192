"""Triton kernels of the fused CUBA neuron (see :mod:`neurofed.gpu.cuba_triton` for what
they compute and why each operation is written as it is). Imported at first launch."""

import triton
import triton.language as tl


@triton.jit
def cuba_fwd(z, cstate, vstate, spike, earg, clast, vlast, R, T, cd, vd, ws, iws, rth, sth, tf, POW2: tl.constexpr,
             RESET: tl.constexpr, SHIFT: tl.constexpr, EARG: tl.constexpr, LAST: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = rows < R
    base = rows.to(tl.int64) * T
    c_int = (tl.load(cstate + rows, mask=live, other=0.0) * ws).to(tl.int64)
    v_int = (tl.load(vstate + rows, mask=live, other=0.0) * ws).to(tl.int64)
    if SHIFT:
        tl.store(spike + base, tl.zeros([BLOCK], tl.float32), mask=live)
    c = tl.zeros([BLOCK], tl.float32)
    vf = tl.zeros([BLOCK], tl.float32)
    for t in range(T):
        x = tl.load(z + base + t, mask=live, other=0.0)
        pc = c_int * cd
        c_int = tl.where(pc >= 0, pc >> 12, -((-pc) >> 12)) + (ws * x).to(tl.int64)
        cf = c_int.to(tl.float32)
        c = cf * iws if POW2 else tl.div_rn(cf, ws)
        pv = v_int * vd
        v_int = tl.where(pv >= 0, pv >> 12, -((-pv) >> 12)) + (ws * c).to(tl.int64)
        vf = v_int.to(tl.float32)
        if RESET:
            v_int = tl.where(vf >= rth, 0, v_int)
        v = vf * iws if POW2 else tl.div_rn(vf, ws)
        s = tl.where(v >= sth, 1.0, 0.0)
        if SHIFT:
            tl.store(spike + base + t + 1, s, mask=live & (rows * 0 + t + 1 < T))  # the last step falls off
        else:
            tl.store(spike + base + t, s, mask=live)
        if EARG:
            tl.store(earg + base + t, tl.div_rn(-tl.abs(v - sth), tf), mask=live)
    if LAST:
        tl.store(clast + rows, c, mask=live)
        tl.store(vlast + rows, vf * iws if POW2 else tl.div_rn(vf, ws), mask=live)


@triton.jit
def cuba_bwd(ex, g, out, R, T, a, fv, fc, SHIFT: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = rows < R
    base = rows.to(tl.int64) * T
    # the last step starts both sums (no 0 + x, which would turn -0 into +0)
    last = T - 1
    if SHIFT:
        gl = tl.zeros([BLOCK], tl.float32)  # grad_spike[T] = 0
    else:
        gl = tl.load(g + base + last, mask=live, other=0.0)
    gv = (a * tl.load(ex + base + last, mask=live, other=0.0)) * gl
    gc = gv
    tl.store(out + base + last, gc, mask=live)
    for i in range(1, T):
        t = last - i
        gt = tl.load(g + base + t + SHIFT, mask=live, other=0.0)
        gs = (a * tl.load(ex + base + t, mask=live, other=0.0)) * gt
        gv = fv * gv + gs
        gc = fc * gc + gv
        tl.store(out + base + t, gc, mask=live)
