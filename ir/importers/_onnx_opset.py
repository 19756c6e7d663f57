"""Which ONNX files the importer reads, and how older ones are brought up to date.

The rules read opset 13 and later as they are (each knows the versions of its op's
definition up to the newest onnx defines, ``Rule.newest``). A file of opset 7 to 12
is converted to opset 13 by ``onnx.version_converter`` first, which rewrites the ops
whose definition changed (a ``Softmax`` over a flattened 2-d view, an ``Upsample``, a
``Dropout``'s ``is_test``); ``from_onnx`` warns that it did. Model-local functions are
inlined.
"""

from __future__ import annotations

import warnings

NATIVE = 13  # the oldest opset read as it is
OLDEST = 7  # the oldest opset converted (numpy broadcasting arrived in 7)


class OnnxConversionWarning(UserWarning):
    """``from_onnx`` converted an older file with ``onnx.version_converter``."""


def prepared(onnx, model, where: str, error) -> tuple[object, int]:
    """``model`` ready for the reader (functions inlined, opset 13 or later), and its
    default-domain opset; ``error(message)`` makes the project error to raise."""
    versions = {e.domain: e.version for e in model.opset_import}
    version = versions.get("", versions.get("ai.onnx"))
    if version is None:
        raise error(f"{where} imports no version of the standard ONNX opset")
    newest = onnx.defs.onnx_opset_version()
    if version > newest:
        raise error(
            f"{where}: opset {version} is newer than the installed onnx knows ({newest}); "
            "upgrade onnx"
        )
    if version < OLDEST:
        raise error(
            f"{where}: opset {version} predates opset {OLDEST} (numpy broadcasting), the "
            "oldest the importer converts; export the model again at a newer opset"
        )
    if model.functions:
        try:
            model = onnx.inliner.inline_local_functions(model)
        except Exception as e:
            raise error(f"{where}: its local functions could not be inlined: {e}") from None
    if version >= NATIVE:
        return model, version
    try:
        converted = onnx.version_converter.convert_version(model, NATIVE)
    except Exception as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise error(
            f"{where}: opset {version} could not be converted to opset {NATIVE} by "
            f"onnx.version_converter ({reason}); export the model at opset {NATIVE} or later"
        ) from None
    warnings.warn(
        f"{where}: opset {version} converted to opset {NATIVE} by onnx.version_converter",
        OnnxConversionWarning,
        stacklevel=3,
    )
    return converted, NATIVE
