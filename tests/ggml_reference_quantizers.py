"""ggml's reference quantizers for Q2_K, Q3_K, IQ4_NL and IQ4_XS, without and with an importance matrix, in
numpy, written from their published math (the `gguf` package quantizes none of these types): the baseline
whose reconstruction error the package's quantizers must not exceed.

Each function takes x (rows, K) and an optional imatrix (K,) and returns the decoded values (float32, x's
shape) as ggml's decoder would produce them from the blocks the reference writes: float16 super-block
scales, integer sub-block scales, integer codes. The searches run in float64 (ggml: float32), which moves a
tie here and there but not the error level. Without an importance matrix ggml weighs each element's error
by |x| (Q2_K, an absolute error) or x^2 (Q3_K, IQ4); with one, by imatrix * sqrt(sigma2 + x^2).
Vectorized over sub-blocks; the element-by-element refinements loop over the 16 or 32 positions.
"""

import numpy as np

IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float64)
_IQ4NL_MIDS = (IQ4NL[1:] + IQ4NL[:-1]) / 2
GROUP_MAX_EPS = 1e-15


def f16(v) -> np.ndarray:
    """A float32 value as stored in a float16 field and read back."""
    return np.asarray(v, np.float32).astype(np.float16).astype(np.float32)


def _div(a, b):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b != 0, a / np.where(b != 0, b, 1), 0.0)


def _signed_extreme(x):
    """Per row, the first value of largest magnitude (with its sign) and that magnitude."""
    i = np.argmax(np.abs(x), axis=1)
    v = x[np.arange(x.shape[0]), i]
    return v, np.abs(v)


def _weights(x, imatrix, block, sigma_factor, plain):
    """Per-element weights: imatrix * sqrt(sigma2 + x^2) with sigma2 = sigma_factor * mean(x^2) over
    `block` elements, or `plain(x)` without an importance matrix."""
    if imatrix is None:
        return plain(x)
    qw = np.broadcast_to(np.asarray(imatrix, np.float64), x.shape)
    blocks = x.reshape(x.shape[0], -1, block)
    sigma2 = sigma_factor * np.mean(blocks ** 2, axis=2, keepdims=True)
    return (qw.reshape(blocks.shape) * np.sqrt(sigma2 + blocks ** 2)).reshape(x.shape)


def make_qkx(x, w, nmax, rmin, rdelta, nstep, use_mad):
    """ggml's make_qkx2/3_quants per row: x ~ scale*L - min, L in [0, nmax], min >= 0, trying spacings
    (nmax + rmin + rdelta*is) / (max - min) with a weighted least-squares refit. Returns scale, min, L."""
    lo, hi = np.minimum(x.min(axis=1), 0.0), x.max(axis=1)
    flat = hi <= lo
    span = np.where(flat, 1.0, hi - lo)
    sum_w, sum_x = w.sum(axis=1), (w * x).sum(axis=1)

    def error(scale, offset, L):
        diff = scale[:, None] * L + offset[:, None] - x
        return (w * (np.abs(diff) if use_mad else diff * diff)).sum(axis=1)

    iscale = nmax / span
    scale = 1 / iscale
    L = np.clip(np.rint(iscale[:, None] * (x - lo[:, None])), 0, nmax)
    best = error(scale, lo, L)
    for step in range(nstep + 1):
        iscale = (rmin + rdelta * step + nmax) / span
        La = np.clip(np.rint(iscale[:, None] * (x - lo[:, None])), 0, nmax)
        sl, sl2, sxl = (w * La).sum(axis=1), (w * La * La).sum(axis=1), (w * La * x).sum(axis=1)
        det = sum_w * sl2 - sl * sl
        this_scale, this_min = _div(sum_w * sxl - sum_x * sl, det), _div(sl2 * sum_x - sl * sxl, det)
        pos = this_min > 0
        this_scale, this_min = np.where(pos, _div(sxl, sl2), this_scale), np.where(pos, 0.0, this_min)
        err = error(this_scale, this_min, La)
        better = (det > 0) & (err < best) & ~flat
        L = np.where(better[:, None], La, L)
        best, scale, lo = np.where(better, err, best), np.where(better, this_scale, scale), np.where(better, this_min, lo)
        span = np.where(flat, 1.0, hi - lo)
    return np.where(flat, 0.0, scale), -lo, np.where(flat[:, None], 0.0, L)


def _refine_levels(x, w, L, lo, hi, require_sl2):
    """ggml's element-by-element refinement (make_qp_quants, make_q3_quants): up to 5 passes; each element's
    level moves to round(x * sl2 / slx) of the other elements' sums when that raises sumlx^2 / suml2
    (make_qp_quants also needs the others' suml2 > 0). Updates L in place; returns sumlx, suml2."""
    sumlx, suml2 = (w * x * L).sum(axis=1), (w * L * L).sum(axis=1)
    for _ in range(5):
        changed = False
        for i in range(x.shape[1]):
            wi, xi, li = w[:, i], x[:, i], L[:, i]
            slx, sl2 = sumlx - wi * xi * li, suml2 - wi * li * li
            new_l = np.clip(np.rint(_div(xi * sl2, slx)), lo, hi)
            slx2, sl22 = slx + wi * xi * new_l, sl2 + wi * new_l * new_l
            accept = (slx > 0) & (new_l != li) & (sl22 > 0) & (slx2 * slx2 * suml2 > sumlx * sumlx * sl22)
            if require_sl2:
                accept &= sl2 > 0
            L[:, i] = np.where(accept, new_l, li)
            sumlx, suml2 = np.where(accept, slx2, sumlx), np.where(accept, sl22, suml2)
            changed = changed or bool(accept.any())
        if not changed:
            break
    return sumlx, suml2


def make_qp_quants(x, nmax, w):
    """ggml's make_qp_quants per row: x >= 0 ~ scale*L, L in [0, nmax], weighted; a few spacings, then
    element-by-element level changes while they raise sumlx^2 / suml2. Returns scale, L."""
    mx = x.max(axis=1)
    zero = mx < GROUP_MAX_EPS
    mx = np.where(zero, 1.0, mx)
    iscale = nmax / mx
    L = np.rint(iscale[:, None] * x)
    best = (w * (x - L / iscale[:, None]) ** 2).sum(axis=1)
    for step in [-4, -3, -2, -1, 1, 2, 3, 4]:
        iscale_is = (0.1 * step + nmax) / mx
        l = np.minimum(nmax, np.rint(iscale_is[:, None] * x))
        mse = (w * (x - l / iscale_is[:, None]) ** 2).sum(axis=1)
        better = mse < best
        best, iscale = np.where(better, mse, best), np.where(better, iscale_is, iscale)
    L = np.minimum(nmax, np.rint(iscale[:, None] * x))
    sumlx, suml2 = _refine_levels(x, w, L, 0, nmax, require_sl2=True)
    return np.where(zero, 0.0, _div(sumlx, suml2)), np.where(zero[:, None], 0.0, L)


def make_qx_quants(x, nmax, w):
    """ggml's make_qx_quants (rmse_type 1) per row: x ~ scale*L, L in [-nmax, nmax-1], the extreme mapped
    to -(nmax + 0.1*is) for is in -9..9, weighted least-squares scale. Returns scale, L."""
    vmax, amax = _signed_extreme(x)
    zero = amax < GROUP_MAX_EPS
    vmax = np.where(zero, 1.0, vmax)

    def levels(iscale):
        L = np.clip(np.rint(iscale[:, None] * x), -nmax, nmax - 1)
        return L, (w * x * L).sum(axis=1), (w * L * L).sum(axis=1)

    L, sumlx, suml2 = levels(-nmax / vmax)
    scale = _div(sumlx, suml2)
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        La, slx, sl2 = levels(-(nmax + 0.1 * step) / vmax)
        better = (sl2 > 0) & (slx * slx > best * sl2)
        L = np.where(better[:, None], La, L)
        scale = np.where(better, _div(slx, sl2), scale)
        best = np.where(better, scale * slx, best)
    return np.where(zero, 0.0, scale), L


def make_q3_quants(x, nmax):
    """ggml's make_q3_quants (do_rmse) per row: the extreme at -nmax, then element-by-element level changes
    under weights x^2 while they raise sumlx^2 / suml2. Returns scale."""
    vmax, amax = _signed_extreme(x)
    zero = amax == 0
    vmax = np.where(zero, 1.0, vmax)
    L = np.clip(np.rint((-nmax / vmax)[:, None] * x), -nmax, nmax - 1)
    sumlx, suml2 = _refine_levels(x, x * x, L, -nmax, nmax - 1, require_sl2=False)
    return np.where(zero, 0.0, _div(sumlx, suml2))


def _rows(x):
    x = np.asarray(x, np.float64)
    return x.reshape(-1, x.shape[-1])


def q2_k(x, imatrix=None):
    r = _rows(x)
    nb = r.size // 256
    sub = r.reshape(nb * 16, 16)
    w = _weights(r, imatrix, 256, 1.0, np.abs).reshape(nb * 16, 16)
    if imatrix is None:
        scale, mins, _ = make_qkx(sub, w, 3, -0.5, 0.1, 15, True)
        scale, mins = scale.reshape(nb, 16), mins.reshape(nb, 16)
        ms, mm = scale.max(axis=1, keepdims=True), mins.max(axis=1, keepdims=True)
        sc = np.where(ms > 0, np.rint(_div(15, ms) * scale), 0)
        mn = np.where(mm > 0, np.rint(_div(15, mm) * mins), 0)
        d, dmin = np.where(ms > 0, ms / 15, 0), np.where(mm > 0, mm / 15, 0)
    else:
        scale, mins, _ = make_qkx(sub, w, 3, -0.9, 0.05, 36, False)
        sw = w.sum(axis=1).reshape(nb, 16)
        d, sc = make_qp_quants(scale.reshape(nb, 16), 15, sw)
        dmin, mn = make_qp_quants(mins.reshape(nb, 16), 15, sw)
        d, dmin = d[:, None], dmin[:, None]
    dl = (f16(d) * sc.astype(np.float32)).reshape(nb * 16, 1)
    ml = (f16(dmin) * mn.astype(np.float32)).reshape(nb * 16, 1)
    q = np.where(dl != 0, np.clip(np.rint(_div(sub + ml, dl)), 0, 3), 0).astype(np.float32)
    return (dl * q - ml).astype(np.float32).reshape(np.shape(x))


def _q3_decode(sub, nb, d, ls):
    """Integer scales ls in [-32, 31] against the float16 d, then the nearest codes in -4..3."""
    dl = (f16(d) * ls.astype(np.float32)).reshape(nb * 16, 1)
    q = np.where(dl != 0, np.clip(np.rint(_div(sub, dl)), -4, 3), 0).astype(np.float32)
    return (dl * q).astype(np.float32)


def q3_k(x, imatrix=None):
    r = _rows(x)
    nb = r.size // 256
    sub = r.reshape(nb * 16, 16)
    if imatrix is None:
        scale = make_q3_quants(sub, 4).reshape(nb, 16)
        max_scale, _ = _signed_extreme(scale)
        iscale = _div(-32, max_scale)[:, None]
        ls = np.clip(np.rint(iscale * scale), -32, 31)
        d = _div(1, iscale)
    else:
        w = _weights(r, imatrix, 256, 2.0, np.square).reshape(nb * 16, 16)
        scale, _ = make_qx_quants(sub, 4, w)
        d, ls = make_qx_quants(scale.reshape(nb, 16), 32, w.sum(axis=1).reshape(nb, 16))
        d = d[:, None]
    return _q3_decode(sub, nb, d, ls).reshape(np.shape(x))


def _nl_index(v):
    """ggml's best_index_int8: the nearest grid value, ties to the upper one."""
    return np.searchsorted(_IQ4NL_MIDS, v, side="right")


def _iq4_scales(sub, w, ntry=7):
    """quantize_row_iq4_nl_impl's per-block search: the extreme at -127 (and -127 + itry), weighted
    least-squares scale. Returns the float scales."""
    vmax, amax = _signed_extreme(sub)
    zero = amax < GROUP_MAX_EPS
    vmax = np.where(zero, 1.0, vmax)

    def sums(inverse):
        q = IQ4NL[_nl_index(inverse[:, None] * sub)]
        return (w * q * sub).sum(axis=1), (w * q * q).sum(axis=1)

    sumqx, sumq2 = sums(1 / (vmax / -IQ4NL[0]))
    d = _div(sumqx, sumq2)
    best = d * sumqx
    for itry in range(-ntry, ntry + 1):
        sqx, sq2 = sums((itry + IQ4NL[0]) / vmax)
        better = (sq2 > 0) & (sqx * sqx > best * sq2)
        d = np.where(better, _div(sqx, sq2), d)
        best = np.where(better, d * sqx, best)
    return np.where(zero, 0.0, d)


def iq4_nl(x, imatrix=None):
    r = _rows(x)
    sub = r.reshape(-1, 32)
    w = _weights(r, imatrix, 32, 2.0, np.square).reshape(-1, 32)
    d = _iq4_scales(sub, w)[:, None]
    idx = _nl_index(_div(1, d) * sub)
    return (f16(d) * IQ4NL[idx].astype(np.float32)).astype(np.float32).reshape(np.shape(x))


def iq4_xs(x, imatrix=None):
    r = _rows(x)
    nb = r.size // 256
    sub = r.reshape(nb * 8, 32)
    w = _weights(r, imatrix, 256, 2.0, np.square).reshape(nb * 8, 32)
    scales = _iq4_scales(sub, w).reshape(nb, 8)
    max_scale, _ = _signed_extreme(scales)
    d = (-max_scale / 32)[:, None]
    ls = np.clip(np.rint(_div(1, d) * scales), -32, 31)
    idx = _nl_index((_div(1, d * ls)).reshape(nb * 8, 1) * sub)
    dl = (f16(d) * ls.astype(np.float32)).reshape(nb * 8, 1)
    return (dl * IQ4NL[idx].astype(np.float32)).astype(np.float32).reshape(np.shape(x))


QUANTIZERS = {"Q2_K": q2_k, "Q3_K": q3_k, "IQ4_NL": iq4_nl, "IQ4_XS": iq4_xs}
