"""ONNX ``Resize`` as one matrix product per resized axis.

Every mode of ``Resize`` (nearest, linear, cubic; antialiasing; every coordinate
transformation) is separable and linear: along each resized axis the output is
``A @ x`` for a matrix ``A`` of (output length, input length), plus a constant where
``tf_crop_and_resize`` extrapolates. ``A`` is computed once, at import time, by onnx's
own reference implementation applied to the identity, so that the imported program
interpolates exactly as the reference does; the program moves each resized axis last,
multiplies by ``A``'s transpose and moves it back. The sizes and scales are constants
(``static`` operands) in the file. (The matrix product costs more than an
interpolation kernel would: the simulator times it as a product.)
"""

from __future__ import annotations

import numpy as np

from ._onnx_rules import Refused, Rule, attr


def _coefficients(mode: str, nearest: str, antialias: bool, a: float):
    from onnx.reference.ops import op_resize as ref

    if mode == "nearest":
        if antialias:
            raise Refused("antialias with mode 'nearest'")
        return lambda x, scale: ref._nearest_coeffs(x, mode=nearest)
    if mode == "cubic":
        fn = ref._cubic_coeffs_antialias if antialias else ref._cubic_coeffs
        return lambda x, scale: fn(x, scale, A=a)
    if mode == "linear":
        return ref._linear_coeffs_antialias if antialias else ref._linear_coeffs
    raise Refused(f"mode {mode!r}")


def _plan(shape, scales, sizes, axes, policy: str):
    """Per axis: (scale, output length), as onnx's reference works them out."""
    r = len(shape)
    axes = list(range(r)) if axes is None else [a % r for a in axes]
    if sizes is not None and len(sizes):
        out = list(shape)
        for i, d in enumerate(axes):
            out[d] = int(sizes[i])
        factors = [out[i] / shape[i] for i in range(r)]
        if policy != "stretch":
            pick = min if policy == "not_larger" else max
            scale = pick(factors[i] for i in axes)
            factors = [scale if i in axes else 1.0 for i in range(r)]
            out = [int(scale * shape[i] + 0.5) if i in axes else shape[i] for i in range(r)]
        return [(float(f), int(o)) for f, o in zip(factors, out)], axes
    if scales is None or not len(scales):
        raise Refused("neither scales nor sizes")
    full = np.ones(r, dtype=np.asarray(scales).dtype)
    for i, d in enumerate(axes):
        full[d] = scales[i]
    out = (full * np.array(shape)).astype(int)
    return [(float(full[i]), int(out[i])) for i in range(r)], axes


def _resize(rd, node):
    try:
        from onnx.reference.ops.op_resize import _interpolate_1d_along_axis
    except ImportError:  # older onnx: no vectorised 1-d interpolation to build the matrices
        raise Refused("this onnx has no vectorised reference Resize (needs onnx >= 1.23)") from None
    x = rd.input(node, 0)
    roi, scales, sizes = rd.static(node, 1), rd.static(node, 2), rd.static(node, 3)
    mode = attr(rd, node, "mode", "nearest")
    ctm = attr(rd, node, "coordinate_transformation_mode", "half_pixel")
    if ctm == "tf_half_pixel_for_nn":
        raise Refused("coordinate_transformation_mode 'tf_half_pixel_for_nn'")
    fct = _coefficients(
        mode,
        attr(rd, node, "nearest_mode", "round_prefer_floor"),
        bool(attr(rd, node, "antialias", 0)),
        attr(rd, node, "cubic_coeff_a", -0.75),
    )
    if mode != "nearest" and not x.type.dtype.is_float:
        raise Refused(f"{mode} interpolation of a {x.type.dtype.value} tensor")
    axes = attr(rd, node, "axes")
    plan, resized = _plan(
        x.type.shape, scales, sizes, axes, attr(rd, node, "keep_aspect_ratio_policy", "stretch")
    )
    r = x.type.rank
    roi = None if roi is None or not roi.size else [float(v) for v in roi]
    if roi is not None and axes is not None:  # the roi lists the resized axes only
        full = [0.0] * r + [1.0] * r
        for i, d in enumerate(resized):
            full[d], full[r + d] = roi[i], roi[len(resized) + i]
        roi = full
    extrapolate = float(attr(rd, node, "extrapolation_value", 0.0))
    exclude = bool(attr(rd, node, "exclude_outside", 0))
    y = x
    changed = [
        d
        for d in resized
        if not (
            np.isclose(plan[d][0], 1.0)
            and plan[d][1] == x.type.shape[d]
            and (roi is None or (np.isclose(roi[d], 0.0) and np.isclose(roi[d + r], 1.0)))
        )
    ]
    if not changed:
        return [rd.call("Identity", x)]
    for k, d in enumerate(changed):
        n = x.type.shape[d]
        scale, m = plan[d]
        if m == 0 or n == 0:
            raise Refused("an empty axis")
        window = None if roi is None else [roi[d], roi[d + r]]

        arguments = dict(roi=window, coordinate_transformation_mode=ctm, exclude_outside=exclude)
        with np.errstate(all="ignore"):
            matrix = _interpolate_1d_along_axis(np.eye(n), 0, scale, m, fct, **arguments)
            offset = _interpolate_1d_along_axis(
                np.zeros((n, 1)), 0, scale, m, fct, extrapolation_value=extrapolate, **arguments
            )[:, 0]
        y = _times(rd, y, d, matrix, offset, last=k == len(changed) - 1)
    return [y]


def _times(rd, y, axis: int, matrix: np.ndarray, offset: np.ndarray, last: bool):
    """``y`` with ``axis`` multiplied by ``matrix`` (plus ``offset``, where not zero)."""
    r = y.type.rank
    dtype = y.type.dtype.numpy
    perm = list(range(r))
    perm[axis], perm[-1] = perm[-1], perm[axis]
    moved = y if axis == r - 1 else rd.b.call("Transpose", y, perm=tuple(perm), name="axis_last")
    key = f"{rd.node.output[0]}::resize{axis}"
    rd.constants[key] = matrix.T.astype(dtype)
    out = rd.b.call("MatMul", moved, rd.tensor(key), name="resized")
    if offset.any():
        rd.constants[f"{key}_offset"] = offset.astype(dtype)
        out = rd.b.call("Add", out, rd.tensor(f"{key}_offset"), name="extrapolated")
    if axis == r - 1:
        return rd.call("Identity", out) if last else out
    if last:
        return rd.call("Transpose", out, perm=tuple(perm))
    return rd.b.call("Transpose", out, perm=tuple(perm), name="axis_back")


RULES: dict[str, Rule] = {"Resize": Rule(_resize, static=(1, 2, 3))}
