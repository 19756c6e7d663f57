"""Seed 001's multi-device annotations in ONNX (the protos of onnx >= 1.18), both ways.

The model lists its device configurations (``ModelProto.configuration``:
``DeviceConfigurationProto`` name, ``num_devices``); each node may carry, per
configuration, a ``NodeDeviceConfigurationProto`` with the ``ShardingSpecProto``
of some of its inputs and outputs (devices or device groups, sharded dims with
their shard counts) and its ``pipeline_stage``.

``onnx.checker`` does not look at these fields, so :func:`check_annotations`
does, on write and on read: the configuration exists, devices are in range,
device groups are listed and do not overlap, axes are in range, every axis has
one simple sharding whose dimension matches the tensor and whose shard count is
between 1 and the axis size (uneven splits follow the project's convention: the
first ``n % k`` shards get one element more), and the shard counts multiply to
the number of devices listed. Each error names the node and the field.

The workbench's layouts live on one device mesh; ONNX has no mesh, so the
mesh's shape and devices are written in the model's ``metadata_props``
(``distir.mesh``) and used on read to give each spec the layout it came from.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from itertools import product
from typing import Any

from ..errors import DistIRError
from ..sharding.mesh import Layout, Mesh, Replicate, Shard
from ..sharding.spec import ShardingSpec

MESH_KEY = "distir.mesh"


class OnnxAnnotationError(DistIRError):
    """A multi-device annotation (device configuration, sharding spec, pipeline stage) that
    is invalid or contradicts another; the message names the node and the field."""


def node_label(node, index: int) -> str:
    return repr(node.name) if node.name else f"#{index} ({node.op_type})"


# -- writing -------------------------------------------------------------------------


def spec_proto(onnx, tensor_name: str, layout: Layout, shape: tuple[int, ...]):
    """The ``ShardingSpecProto`` of ``layout`` for a tensor of ``shape``."""
    spec = ShardingSpec.from_layout(layout.normalized(len(shape)))
    proto = onnx.ShardingSpecProto(tensor_name=tensor_name, device=list(spec.devices))
    for key, group in spec.device_map.items():
        proto.index_to_device_group_map.append(
            onnx.IntIntListEntryProto(key=key, value=list(group))
        )
    for axis, n in spec.sharded_dims:
        proto.sharded_dim.append(
            onnx.ShardedDimProto(
                axis=axis,
                simple_sharding=[onnx.SimpleShardedDimProto(dim_value=shape[axis], num_shards=n)],
            )
        )
    return proto


def device_configuration(onnx, name: str, meshes: list[Mesh]):
    devices = sorted({d for m in meshes for d in m.devices})
    count = devices[-1] + 1 if devices else 1
    return onnx.DeviceConfigurationProto(
        name=name, num_devices=count, device=[f"device{i}" for i in range(count)]
    )


def mesh_metadata(mesh: Mesh) -> str:
    return json.dumps({"shape": list(mesh.shape), "devices": list(mesh.devices)})


# -- validation ----------------------------------------------------------------------


def configurations(model) -> dict[str, int]:
    """Each configuration's name and number of devices, checked."""
    out: dict[str, int] = {}
    for i, c in enumerate(model.configuration):
        where = f"model configuration[{i}]"
        if not c.name:
            raise OnnxAnnotationError(f"{where}.name is empty: every configuration needs a name")
        if c.name in out:
            raise OnnxAnnotationError(f"{where}.name {c.name!r} is given twice")
        if c.num_devices < 1:
            raise OnnxAnnotationError(f"{where}.num_devices is {c.num_devices}: must be >= 1")
        if c.device and len(c.device) != c.num_devices:
            raise OnnxAnnotationError(
                f"{where}.device lists {len(c.device)} names for num_devices={c.num_devices}"
            )
        out[c.name] = c.num_devices
    return out


def check_annotations(model, shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Raise :class:`OnnxAnnotationError` at the first invalid multi-device field."""
    configs = configurations(model)
    for i, node in enumerate(model.graph.node):
        seen: set[str] = set()
        for k, dc in enumerate(node.device_configurations):
            where = f"node {node_label(node, i)} device_configurations[{k}]"
            if dc.configuration_id not in configs:
                known = ", ".join(map(repr, configs)) or "none"
                raise OnnxAnnotationError(
                    f"{where}.configuration_id {dc.configuration_id!r} names no device "
                    f"configuration of the model (it has: {known})"
                )
            if dc.configuration_id in seen:
                raise OnnxAnnotationError(
                    f"{where}.configuration_id {dc.configuration_id!r} is given twice on the node"
                )
            seen.add(dc.configuration_id)
            if dc.HasField("pipeline_stage") and dc.pipeline_stage < 0:
                raise OnnxAnnotationError(
                    f"{where}.pipeline_stage is {dc.pipeline_stage}: stages count from 0"
                )
            names: set[str] = set()
            for j, spec in enumerate(dc.sharding_spec):
                field = f"{where}.sharding_spec[{j}]"
                if spec.tensor_name in names:
                    raise OnnxAnnotationError(
                        f"{field}.tensor_name {spec.tensor_name!r} has two specs on the node"
                    )
                names.add(spec.tensor_name)
                _check_spec(node, spec, field, configs[dc.configuration_id], shapes)


def _check_spec(node, spec, field: str, num_devices: int, shapes) -> None:
    if spec.tensor_name not in (*node.input, *node.output):
        raise OnnxAnnotationError(
            f"{field}.tensor_name {spec.tensor_name!r} is neither an input nor an output of "
            f"the node (inputs {list(node.input)}, outputs {list(node.output)})"
        )
    groups: dict[int, list[int]] = {}
    for g, entry in enumerate(spec.index_to_device_group_map):
        if entry.key in groups:
            raise OnnxAnnotationError(
                f"{field}.index_to_device_group_map[{g}].key {entry.key} is given twice"
            )
        if entry.key not in spec.device:
            raise OnnxAnnotationError(
                f"{field}.index_to_device_group_map[{g}].key {entry.key} is not in "
                f"{field}.device {list(spec.device)}"
            )
        if not entry.value:
            raise OnnxAnnotationError(f"{field}.index_to_device_group_map[{g}] is an empty group")
        groups[entry.key] = list(entry.value)
    physical: list[int] = []
    for d, entry in enumerate(spec.device):
        members = groups.get(entry, [entry])
        for member in members:
            if not 0 <= member < num_devices:
                what = f"device {member} of group {entry}" if entry in groups else f"{entry}"
                raise OnnxAnnotationError(
                    f"{field}.device[{d}]: {what} does not exist (the configuration has "
                    f"{num_devices} devices, 0..{num_devices - 1})"
                )
        physical += members
    if len(set(physical)) != len(physical):
        raise OnnxAnnotationError(
            f"{field}.device {list(spec.device)} reaches a device twice: {physical}"
        )
    shape = shapes.get(spec.tensor_name)
    rank = None if shape is None else len(shape)
    axes: set[int] = set()
    shards = 1
    for a, dim in enumerate(spec.sharded_dim):
        where = f"{field}.sharded_dim[{a}]"
        if rank is not None and not -rank <= dim.axis < rank:
            raise OnnxAnnotationError(
                f"{where}.axis {dim.axis} is out of range for {spec.tensor_name!r} of rank {rank}"
            )
        axis = dim.axis % rank if rank else dim.axis
        if axis in axes:
            raise OnnxAnnotationError(f"{where}.axis {dim.axis} shards an axis a second time")
        axes.add(axis)
        if len(dim.simple_sharding) != 1:
            raise OnnxAnnotationError(
                f"{where}.simple_sharding has {len(dim.simple_sharding)} entries; the importer "
                "reads exactly one per axis (no fused axes)"
            )
        (simple,) = dim.simple_sharding
        n = simple.num_shards
        if n < 1:
            raise OnnxAnnotationError(f"{where}.simple_sharding[0].num_shards is {n}: must be >= 1")
        if shape is not None:
            size = shape[axis]
            if simple.HasField("dim_value") and simple.dim_value != size:
                raise OnnxAnnotationError(
                    f"{where}.simple_sharding[0].dim_value {simple.dim_value} contradicts "
                    f"{spec.tensor_name!r}'s axis {axis} of size {size}"
                )
            if n > size:
                raise OnnxAnnotationError(
                    f"{where}.simple_sharding[0].num_shards {n} is more than the {size} "
                    f"element(s) of axis {axis} of {spec.tensor_name!r}"
                )
        shards *= n
    if shards != len(spec.device):
        raise OnnxAnnotationError(
            f"{field}: the shard counts multiply to {shards} but device lists "
            f"{len(spec.device)} entries {list(spec.device)}: give one device (or group) per shard"
        )


# -- reading -------------------------------------------------------------------------


def model_mesh(model) -> Mesh | None:
    for entry in model.metadata_props:
        if entry.key == MESH_KEY:
            try:
                data = json.loads(entry.value)
                return Mesh(tuple(data["shape"]), tuple(data["devices"]))
            except (ValueError, KeyError, TypeError, DistIRError) as e:
                raise OnnxAnnotationError(
                    f"model metadata_props {MESH_KEY!r} is not a mesh ({e}): {entry.value!r}"
                ) from None
    return None


def spec_layout(spec, rank: int, mesh: Mesh | None) -> Layout:
    """The layout a ``ShardingSpecProto`` describes: on ``mesh`` when one fits it."""
    groups = {e.key: list(e.value) for e in spec.index_to_device_group_map}
    dims = [
        (d.axis % rank if rank else d.axis, d.simple_sharding[0].num_shards)
        for d in spec.sharded_dim
    ]
    plain = ShardingSpec(list(spec.device), dims, groups)
    if mesh is not None:
        for layout in _mesh_layouts(mesh, rank):
            try:
                candidate = ShardingSpec.from_layout(layout)
            except DistIRError:
                continue
            if candidate.groups == plain.groups and candidate.sharded_dims == plain.sharded_dims:
                return layout
    return plain.to_layout()


def _mesh_layouts(mesh: Mesh, rank: int):
    choices: list[Any] = [Replicate(), *(Shard(a) for a in range(rank))]
    for placements in product(choices, repeat=mesh.ndim):
        yield Layout(mesh, list(placements))


def stage_and_specs(node, configuration: str):
    """The node's pipeline stage (or None) and specs in ``configuration``."""
    for dc in node.device_configurations:
        if dc.configuration_id == configuration:
            stage = dc.pipeline_stage if dc.HasField("pipeline_stage") else None
            return stage, list(dc.sharding_spec)
    return None, []
