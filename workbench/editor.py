"""The sharding editor: place the selected value on a device mesh, or by an ONNX spec.

The pure half reads what the user typed (:func:`parse_mesh_shape`,
:func:`parse_devices`, :func:`mesh_annotation`, :func:`parse_spec`) and is
tested without Jupyter. :class:`ShardingEditor` is the ipywidgets panel: a mesh
shape, one placement per mesh axis (``R``, ``S(i)``, ``P(sum)``) or an ONNX
``ShardingSpec``; Apply, Remove, Undo and Redo act on a
:class:`~workbench.session.Session`, and errors appear in the panel.
"""

from __future__ import annotations

import ast
import html
import math
import re
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import ipywidgets as w

from ir.errors import DistIRError
from ir.limits import MAX_DEVICES
from ir.sharding import Mesh, ShardingSpec, placement

from .session import Annotation, Session, SessionError

PARTIAL_OPS = ("sum", "max", "min", "mean")


MAX_MESH_AXES = 16
"""Mesh axes the editor accepts (it shows one placement dropdown per axis)."""


def _shown(text: str) -> str:
    return repr(text) if len(text) <= 40 else repr(text[:37] + "...")


def parse_mesh_shape(text: str) -> tuple[int, ...]:
    """``"2x4"``, ``"2, 4"``, ``"(2, 4)"`` or ``"8"`` -> the mesh shape.

    At most :data:`MAX_MESH_AXES` axes and ``ir.limits.MAX_DEVICES`` devices in all,
    checked before anything of that size is made.

    >>> parse_mesh_shape("2x4"), parse_mesh_shape("8")
    ((2, 4), (8,))
    """
    parts = [p for p in re.split(r"[x×*,\s()\[\]]+", text.strip().lower()) if p]
    # ASCII digits only ('²' is a digit to str.isdigit), and no more than a size can need
    if not parts or not all(re.fullmatch(r"[0-9]{1,19}", p) and int(p) > 0 for p in parts):
        raise SessionError(
            f"mesh shape {_shown(text)}: write positive sizes separated by 'x', e.g. '8' or '2x4'"
        )
    if len(parts) > MAX_MESH_AXES:
        raise SessionError(
            f"mesh shape {_shown(text)} has {len(parts)} axes; the editor takes at most "
            f"{MAX_MESH_AXES}"
        )
    shape = tuple(int(p) for p in parts)
    if math.prod(shape) > MAX_DEVICES:
        raise SessionError(
            f"mesh shape {_shown(text)} holds {math.prod(shape)} devices, more than the limit "
            f"{MAX_DEVICES} (ir.limits.MAX_DEVICES)"
        )
    return shape


def parse_devices(text: str, size: int) -> tuple[int, ...]:
    """``""`` (devices 0..size-1), ``"4..7"``, ``"0, 2, 4, 6"`` -> ``size`` device ids.

    >>> parse_devices("", 4), parse_devices("4..7", 4), parse_devices("0,2", 2)
    ((0, 1, 2, 3), (4, 5, 6, 7), (0, 2))
    """
    text = text.strip().strip("[]()")
    if not text:
        return tuple(range(size))
    found: list[int] = []
    for part in re.split(r"[,\s]+", text):
        if not part:
            continue
        lo, dots, hi = part.partition("..")
        number = r"[0-9]{1,19}"  # ASCII digits, no more than a device id can need
        if not (re.fullmatch(number, lo) and (not dots or re.fullmatch(number, hi))):
            raise SessionError(
                f"devices {_shown(text)}: cannot read {_shown(part)}; write e.g. '0..7' or '0, 2'"
            )
        first, last = int(lo), int(hi) if dots else int(lo)
        if len(found) + max(0, last - first + 1) > size:  # counted before it is listed
            raise SessionError(f"devices {_shown(text)} list more devices than the mesh's {size}")
        found += range(first, last + 1)
    if len(found) != size:
        raise SessionError(
            f"devices {_shown(text)} lists {len(found)} device(s) but the mesh holds {size}"
        )
    return tuple(found)


def placement_options(rank: int) -> list[str]:
    """What one mesh axis may do to a tensor of ``rank`` dimensions.

    >>> placement_options(2)
    ['R', 'S(0)', 'S(1)', 'P(sum)', 'P(max)', 'P(min)', 'P(mean)']
    """
    return ["R", *(f"S({i})" for i in range(rank)), *(f"P({op})" for op in PARTIAL_OPS)]


def mesh_annotation(
    shape_text: str, placements: list[str] | tuple[str, ...], devices_text: str = ""
) -> tuple[Mesh, tuple[Any, ...]]:
    """The annotation for a mesh shape, one placement per mesh axis, and its devices.

    >>> mesh, ps = mesh_annotation("2x2", ["S(0)", "R"], "4..7")
    >>> mesh.shape, mesh.devices, [str(p) for p in ps]
    ((2, 2), (4, 5, 6, 7), ['S(0)', 'R'])
    """
    shape = parse_mesh_shape(shape_text)
    if len(placements) != len(shape):
        raise SessionError(
            f"mesh {shape_text!r} has {len(shape)} axes but {len(placements)} placement(s) "
            f"were given ({', '.join(placements)}): give one per mesh axis"
        )
    devices = parse_devices(devices_text, math.prod(shape))
    return Mesh(shape, devices), tuple(placement(p) for p in placements)


_SPEC_KEYS = ("devices", "sharded_dims", "device_map")


def parse_spec(text: str) -> ShardingSpec:
    """An ONNX-style spec: ``devices=[0, 1] sharded_dims=[(0, 2)] device_map={0: [0, 2]}``.

    Keys may be separated by spaces or commas; ``sharded_dims`` lists
    ``(axis, num_shards)`` pairs (``dims`` is accepted too).

    >>> spec = parse_spec("devices=[0, 1, 2, 3] sharded_dims=[(0, 2), (1, 2)]")
    >>> spec.devices, spec.sharded_dims
    ((0, 1, 2, 3), ((0, 2), (1, 2)))
    """
    pieces = re.split(r"\b(devices|sharded_dims|dims|device_map)\s*=", text)
    if pieces[0].strip(" ,"):
        raise SessionError(
            f"spec {text!r}: cannot read {pieces[0].strip()!r}; write "
            "'devices=[0, 1] sharded_dims=[(0, 2)]' (device_map={...} optional)"
        )
    fields: dict[str, Any] = {}
    for key, raw in zip(pieces[1::2], pieces[2::2]):
        key = "sharded_dims" if key == "dims" else key
        try:
            fields[key] = ast.literal_eval(raw.strip().rstrip(","))
        except (ValueError, SyntaxError, RecursionError, MemoryError):  # too deep nests too
            raise SessionError(
                f"spec {_shown(text)}: {key} = {_shown(raw.strip())} is not a literal"
            ) from None
    if "devices" not in fields:
        raise SessionError(f"spec {text!r}: give the devices, e.g. 'devices=[0, 1]'")
    return ShardingSpec(**fields)


def annotation_text(spec: Annotation) -> tuple[str, list[str], str]:
    """(mesh shape text, placement texts, devices text) of a mesh annotation, for the form."""
    mesh, placements = spec
    shape = "x".join(str(n) for n in mesh.shape)
    devices = mesh.devices
    dense = devices == tuple(range(devices[0], devices[0] + len(devices)))
    dev_text = "" if devices == tuple(range(len(devices))) else ", ".join(map(str, devices))
    if dense and devices[0] != 0:
        dev_text = f"{devices[0]}..{devices[-1]}"
    return shape, [str(p) for p in placements], dev_text


# rows of controls wrap rather than run past the right edge of a narrow side panel
_WRAP = {"flex_flow": "row wrap"}


def _no_activity(what: str) -> AbstractContextManager[None]:
    return nullcontext()


class ShardingEditor(w.VBox):
    """The editor panel for one :class:`Session`; :meth:`select` picks the value to place.

    ``working(what)`` (a context manager, the dashboard's
    :meth:`~workbench.tasks.Activity.working`) shows that an action is under way and
    disables the buttons while it runs; ``busy()`` says whether one is.
    """

    def __init__(
        self,
        session: Session,
        working: Callable[[str], AbstractContextManager[None]] = _no_activity,
        busy: Callable[[], bool] = lambda: False,
    ) -> None:
        self.session = session
        self._working, self._busy = working, busy
        self.value_name: str | None = None
        self.target = w.HTML("<i>click a value (an edge or an input) in the graph</i>")
        self.target.add_class("distir-editor-target")
        self.mode = w.ToggleButtons(
            options=[("mesh", "mesh"), ("ONNX spec", "spec")],
            value="mesh",
            style={"button_width": "110px"},
        )
        n = len(session.topology.devices)
        self.mesh_shape = w.Text(value=str(n), description="mesh", layout={"width": "170px"})
        self.mesh_shape.add_class("distir-mesh-shape")
        self.devices = w.Text(
            value="", placeholder=f"0..{n - 1}", description="devices", layout={"width": "220px"}
        )
        self.placements = w.HBox(layout=_WRAP)
        self.spec = w.Text(
            placeholder="devices=[0, 1] sharded_dims=[(0, 2)]",
            description="spec",
            layout={"width": "98%"},
        )
        self.apply_button = self._button("Apply", "primary", self._on_apply, "distir-apply")
        self.remove_button = self._button("Remove", "", self._on_remove, "distir-remove")
        self.undo_button = self._button("Undo", "", lambda _: self._undo(), "distir-undo")
        self.redo_button = self._button("Redo", "", lambda _: self._redo(), "distir-redo")
        self.status = w.HTML("")
        self.status.add_class("distir-editor-status")
        self.mesh_box = w.VBox(
            [w.HBox([self.mesh_shape, self.devices], layout=_WRAP), self.placements]
        )
        self.spec_box = w.VBox([self.spec])
        self.form = w.VBox([self.mesh_box])
        self.mesh_shape.observe(lambda _: self._rebuild_placements(), names="value")
        self.mode.observe(self._on_mode, names="value")
        super().__init__(
            [
                w.HTML("<b>Sharding editor</b>"),
                self.target,
                self.mode,
                self.form,
                w.HBox(
                    [self.apply_button, self.remove_button, self.undo_button, self.redo_button],
                    layout=_WRAP,
                ),
                self.status,
            ],
            layout={"padding": "4px", "border": "1px solid #ddd"},
        )
        self._rebuild_placements()
        self.refresh()

    @staticmethod
    def _button(label: str, style: str, handler: Any, css: str) -> w.Button:
        button = w.Button(description=label, button_style=style, layout={"width": "80px"})
        button.add_class(css)
        button.on_click(handler)
        return button

    # -- what the dashboard calls ------------------------------------------------------

    def select(self, value_name: str | None, note: str = "") -> None:
        """Edit the placement of base-program value ``value_name`` (None: nothing selected)."""
        self.value_name = value_name
        if value_name is None:
            self.target.value = f"<i>{html.escape(note or 'select a value in the graph')}</i>"
            self.refresh()
            return
        value = self.session.base.value(value_name)
        text = f"<b>{html.escape(value_name)}</b>: <code>{html.escape(str(value.type))}</code>"
        if note:
            text += f" <small>({html.escape(note)})</small>"
        self.target.value = text
        current = self.session.state.annotation(value_name)
        if isinstance(current, tuple):
            shape, placements, devices = annotation_text(current)
            self.mode.value = "mesh"
            self.mesh_shape.value, self.devices.value = shape, devices
            self._rebuild_placements(placements)
        elif current is not None:
            self.mode.value = "spec"
        else:
            mesh = self._session_mesh()
            if mesh is not None:  # every annotation shares one mesh: offer it
                self.mesh_shape.value, _, self.devices.value = annotation_text((mesh, ()))
            self._rebuild_placements()
        self.refresh()

    def refresh(self) -> None:
        """Enable the buttons that can act and show the session's error, if any."""
        if self._busy():  # an action is under way: its end enables them again
            for button in (self.apply_button, self.remove_button, self.undo_button):
                button.disabled = True
            self.redo_button.disabled = True
        else:
            self._enable()
        if self.session.error:
            self.status.value = (
                '<div style="color:#b2182b;white-space:pre-wrap">'
                f"{html.escape(self.session.error)}</div>"
            )
        else:
            self.status.value = f"<small>{html.escape(self.session.state.describe())}</small>"

    def _enable(self) -> None:
        self.apply_button.disabled = self.value_name is None
        self.remove_button.disabled = (
            self.value_name is None or self.session.state.annotation(self.value_name) is None
        )
        self.undo_button.disabled = not self.session.can_undo
        self.redo_button.disabled = not self.session.can_redo

    def annotation(self) -> Annotation:
        """The annotation the form describes now (raises SessionError/DistIRError if bad)."""
        if self.mode.value == "spec":
            return parse_spec(self.spec.value)
        chosen = [d.value for d in self.placements.children]
        return mesh_annotation(self.mesh_shape.value, chosen, self.devices.value)

    # -- handlers ----------------------------------------------------------------------

    def _on_apply(self, _button: Any = None) -> None:
        if self.value_name is None:
            return
        try:
            spec = self.annotation()
        except Exception as e:  # a button's handler: whatever the form holds, say so in the panel
            kind = "" if isinstance(e, DistIRError) else f"{type(e).__name__}: "
            self.session.error = f"cannot read the form: {kind}{e}"
            self.refresh()
            return
        with self._working(f"propagating {self.value_name} and simulating…"):
            self.session.annotate(self.value_name, spec)

    def busy(self, message: str) -> None:
        """Say in the panel that work is under way (the browser shows it at once)."""
        self.apply_button.disabled = True
        self.status.value = f"<i>{html.escape(message)}</i>"

    def _on_remove(self, _button: Any = None) -> None:
        if self.value_name is not None:
            with self._working(f"removing the placement of {self.value_name}…"):
                self.session.unannotate(self.value_name)

    def _undo(self) -> None:
        with self._working("undoing…"):
            self.session.undo()

    def _redo(self) -> None:
        with self._working("redoing…"):
            self.session.redo()

    def _on_mode(self, change: dict[str, Any]) -> None:
        self.form.children = [self.mesh_box if change["new"] == "mesh" else self.spec_box]

    def _rebuild_placements(self, chosen: list[str] | None = None) -> None:
        try:
            shape = parse_mesh_shape(self.mesh_shape.value)
        except SessionError:
            return  # half-typed; keep the dropdowns until the shape reads again
        rank = self._rank()
        options = placement_options(rank)
        old = [d.value for d in self.placements.children]
        default = "S(0)" if rank else "R"
        dropdowns = []
        for axis in range(len(shape)):
            pick = (chosen or old or [])[axis] if axis < len(chosen or old or []) else default
            dropdown = w.Dropdown(
                options=options,
                value=pick if pick in options else default,
                description=f"axis {axis}",
                layout={"width": "150px"},
                style={"description_width": "45px"},
            )
            dropdown.add_class(f"distir-placement-{axis}")
            dropdowns.append(dropdown)
        self.placements.children = dropdowns

    def _rank(self) -> int:
        if self.value_name is None:
            return 2
        t = self.session.base.value(self.value_name).type
        return len(getattr(t, "shape", ()))

    def _session_mesh(self) -> Mesh | None:
        for spec in self.session.annotations.values():
            if isinstance(spec, tuple) and isinstance(spec[0], Mesh):
                return spec[0]
        return None
