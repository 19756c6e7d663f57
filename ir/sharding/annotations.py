"""User annotations: reading them from a dict or from ``ShardAnnotate`` ops, and checking them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..builder import FunctionBuilder, rebuild_op
from ..function import Function
from ..value import Value
from .errors import AnnotationError, ConflictingAnnotationError, MeshError
from .mesh import Layout, Mesh
from .rules import element_rank
from .spec import ShardingSpec

AnnotationLike = Any  # (Mesh, placements) | Layout | ShardingSpec


def as_layout(annotation: AnnotationLike, value: str = "value") -> Layout:
    """A Layout from ``(mesh, placements)``, a Layout or an ONNX ShardingSpec."""
    if isinstance(annotation, Layout):
        return annotation
    if isinstance(annotation, ShardingSpec):
        return annotation.to_layout()
    if isinstance(annotation, tuple) and len(annotation) == 2:
        mesh, placements = annotation
        if not isinstance(mesh, Mesh):
            mesh = Mesh(mesh)
        if isinstance(placements, str):
            placements = [placements]
        if not isinstance(placements, (list, tuple)):
            raise AnnotationError(
                f"annotation of {value!r}: placements must be a list such as ['S(0)', 'R'], "
                f"got {placements!r}"
            )
        return Layout(mesh, list(placements))
    raise AnnotationError(
        f"annotation of {value!r} must be (Mesh, placements), a Layout or a ShardingSpec, "
        f"got {annotation!r}"
    )


def annotate(function: Function, annotations: Mapping[str, AnnotationLike]) -> Function:
    """``function`` with a ``ShardAnnotate`` op after each annotated value (prints and parses).

    Annotated inputs and results are re-pointed: later ops read the annotated value.
    """
    b = FunctionBuilder(function.name)
    env: dict[Value, Value] = {}
    todo = {name: as_layout(a, name) for name, a in annotations.items()}
    known = {v.name for v in function.inputs} | {v.name for op in function.ops for v in op.outputs}
    for name in todo:
        if name not in known:
            raise AnnotationError(f"function {function.name!r} has no value named {name!r}")

    def mark(old: Value, new: Value) -> None:
        layout = todo.get(old.name)
        if layout is not None:
            layout.check(shape_of(old), old.name)
            new = b.add_op("ShardAnnotate", [new], layout.attributes(), names=[old.name]).outputs[0]
        env[old] = new

    for v in function.inputs:
        mark(v, b.input(v.name, v.type))
    for op in function.ops:
        outs = rebuild_op(b, op, [env[v] for v in op.inputs])
        for old, new in zip(op.outputs, outs):
            mark(old, new)
    return b.finish([env[v] for v in function.outputs])


def shape_of(v: Value) -> tuple[int, ...]:
    t = v.type
    while not hasattr(t, "shape"):
        t = t.elements[0]  # type: ignore[union-attr]
    return t.shape  # type: ignore[union-attr]


def collect(
    function: Function, annotations: Mapping[str, AnnotationLike] | None, mesh: Mesh | None
) -> tuple[dict[Value, Layout], Mesh]:
    """Every user annotation, by value, all on one mesh; conflicts are errors."""
    found: dict[Value, tuple[Layout, str]] = {}
    if annotations is not None and not isinstance(annotations, Mapping):
        raise AnnotationError(
            f"annotations must map value names to layouts, got {annotations!r} "
            f"({type(annotations).__name__})"
        )
    if mesh is not None and not isinstance(mesh, Mesh):
        raise MeshError(f"mesh must be an ir.sharding.Mesh or None, got {mesh!r}")

    def add(v: Value, layout: Layout, source: str) -> None:
        layout.check(shape_of(v), v.name)
        layout = layout.normalized(element_rank(v.type))
        if v in found and found[v][0] != layout:
            other, where = found[v]
            raise ConflictingAnnotationError(
                f"value {v.name!r} is annotated twice, {other} ({where}) and {layout} "
                f"({source}): user annotations must agree, one layout per value"
            )
        found[v] = (layout, source)

    for name, a in (annotations or {}).items():
        try:
            v = function.value(name)
        except KeyError:
            raise AnnotationError(
                f"function {function.name!r} has no value named {name!r} to annotate"
            ) from None
        add(v, as_layout(a, name), "given to propagate")
    for op in function.ops:
        if op.op_type == "ShardAnnotate":
            layout = Layout.from_attributes(op.attributes)
            add(op.inputs[0], layout, "a ShardAnnotate op")
            add(op.outputs[0], layout, "a ShardAnnotate op")
    layouts = {v: lay for v, (lay, _) in found.items()}
    if mesh is None:
        if not layouts:
            raise AnnotationError("propagate needs at least one annotation (or a mesh)")
        mesh = next(iter(layouts.values())).mesh
    for v, layout in layouts.items():
        check_mesh(layout.mesh, mesh, v.name)
    return layouts, mesh


def check_mesh(mesh: Mesh, reference: Mesh, value: str) -> None:
    missing = [d for d in mesh.devices if d not in reference.devices]
    if missing:
        raise MeshError(
            f"value {value!r} is placed on device(s) {missing}, which are not in the mesh "
            f"{list(reference.devices)} (rule: one mesh per propagation)"
        )
    if mesh != reference:
        raise MeshError(
            f"value {value!r} uses mesh {mesh}, other annotations use {reference} "
            "(rule: one mesh per propagation)"
        )


def devices_in(topology_devices: Sequence[int], mesh: Mesh) -> None:
    missing = [d for d in mesh.devices if d not in topology_devices]
    if missing:
        raise MeshError(
            f"mesh devices {missing} are not in the topology (devices {list(topology_devices)})"
        )
