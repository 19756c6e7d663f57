"""Static HTML of a Jupyter widget from a notebook's saved widget state.

A notebook executed with its widget state stored (nbclient does so by default) keeps, in
``metadata.widgets``, every widget model's last state; an output that showed a widget keeps
only its model id. :class:`SavedWidgets` turns such a model and its children into HTML that
needs no kernel and no JavaScript widget manager: boxes as flex boxes, HTML as itself,
controls as disabled controls showing their values, progress bars as ``<progress>``, the
graph view's SVG inline, a :class:`~widgets.chart.Chart` as its latest figure (its state) with
plotly.js inline once per page. A plotly ``FigureWidget`` becomes a note: its saved state is its
first figure, not its last (later changes travel as messages that are not saved). The offline course
(``scripts/build_course.py``) uses it so that the dashboard and progress bars appear on its
pages as they were when the notebook finished.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["WIDGET_STATE_MIME", "WIDGET_VIEW_MIME", "SavedWidgets"]

WIDGET_VIEW_MIME = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE_MIME = "application/vnd.jupyter.widget-state+json"
_REF = "IPY_MODEL_"
_BUTTON_COLOURS = {
    "primary": "#2f6fb3",
    "info": "#3a9bbf",
    "success": "#3b8f3b",
    "warning": "#d48a1c",
    "danger": "#c4332b",
}


class SavedWidgets:
    """The saved widget models of one notebook, rendered as static HTML on request.

    ``state`` maps model ids to ``{"model_name": ..., "state": {...}}`` (the
    ``state`` of the notebook's widget-state metadata).
    """

    def __init__(
        self, state: Mapping[str, Mapping[str, Any]], *, plotly_on_page: bool = False
    ) -> None:
        self.state = state
        # whether plotly.js is on the page already (the first chart drawn puts it there)
        self.plotly_on_page = plotly_on_page

    def html(self, model_id: str) -> str:
        """HTML of the widget ``model_id`` and everything inside it."""
        model = self.state.get(model_id)
        if model is None:
            return _note(f"a widget whose state was not saved ({model_id})")
        attrs = model.get("state", {})
        if self._hidden(attrs):
            return ""
        name = model.get("model_name", "")
        render = _RENDERERS.get(name)
        if render is None:
            return _note(f"a {name or 'widget'} that has no static form")
        return render(self, attrs)

    def _hidden(self, attrs: Mapping[str, Any]) -> bool:
        layout = self.state.get(str(attrs.get("layout", "")).removeprefix(_REF), {})
        style = layout.get("state", {})
        return style.get("display") == "none" or style.get("visibility") == "hidden"

    def _children(self, attrs: Mapping[str, Any]) -> str:
        return "".join(self.html(str(c).removeprefix(_REF)) for c in attrs.get("children", []))


def _note(text: str) -> str:
    return f'<div class="saved-widget-note"><i>({html.escape(text)}: run the notebook)</i></div>'


def _described(attrs: Mapping[str, Any], control: str) -> str:
    label = html.escape(str(attrs.get("description", "")))
    return f"<label style='margin:2px 6px 2px 0'>{label} {control}</label>" if label else control


def _box(direction: str) -> Callable[[SavedWidgets, Mapping[str, Any]], str]:
    def render(saved: SavedWidgets, attrs: Mapping[str, Any]) -> str:
        return (
            f'<div style="display:flex;flex-direction:{direction};flex-wrap:wrap;gap:4px">'
            f"{saved._children(attrs)}</div>"
        )

    return render


def _html_value(saved: SavedWidgets, attrs: Mapping[str, Any]) -> str:
    return _described(attrs, f"<div>{attrs.get('value', '')}</div>")


def _label(saved: SavedWidgets, attrs: Mapping[str, Any]) -> str:
    return f"<span>{html.escape(str(attrs.get('value', '')))}</span>"


def _button(saved: SavedWidgets, attrs: Mapping[str, Any]) -> str:
    colour = _BUTTON_COLOURS.get(str(attrs.get("button_style", "")))
    style = f' style="background:{colour};color:white"' if colour else ""
    return f"<button disabled{style}>{html.escape(str(attrs.get('description', '')))}</button>"


def _text(saved: SavedWidgets, attrs: Mapping[str, Any]) -> str:
    value = html.escape(str(attrs.get("value", "")), quote=True)
    return _described(attrs, f'<input disabled value="{value}" size="{max(len(value), 4)}">')


def _dropdown(saved: SavedWidgets, attrs: Mapping[str, Any]) -> str:
    labels, index = attrs.get("_options_labels", []), attrs.get("index")
    options = "".join(
        f"<option{' selected' if i == index else ''}>{html.escape(str(label))}</option>"
        for i, label in enumerate(labels)
    )
    return _described(attrs, f"<select disabled>{options}</select>")


def _toggle_buttons(saved: SavedWidgets, attrs: Mapping[str, Any]) -> str:
    labels, index = attrs.get("_options_labels", []), attrs.get("index")
    chosen = ' style="font-weight:bold;border-width:2px"'
    buttons = "".join(
        f"<button disabled{chosen if i == index else ''}>{html.escape(str(label))}</button>"
        for i, label in enumerate(labels)
    )
    return _described(attrs, f"<span>{buttons}</span>")


def _checkbox(saved: SavedWidgets, attrs: Mapping[str, Any]) -> str:
    checked = " checked" if attrs.get("value") else ""
    return _described(attrs, f'<input type="checkbox" disabled{checked}>')


def _progress(saved: SavedWidgets, attrs: Mapping[str, Any]) -> str:
    value, top = attrs.get("value", 0), attrs.get("max", 100)
    return _described(attrs, f'<progress value="{value}" max="{top}">{value}/{top}</progress>')


def _anywidget(saved: SavedWidgets, attrs: Mapping[str, Any]) -> str:
    if "svg" in attrs:  # widgets.graph_widget.GraphView: the SVG that Python drew
        return (
            f"{attrs.get('legend_html', '')}"
            '<div class="distir-graph-box" style="overflow:auto;max-height:80vh;'
            f'border:1px solid #ddd">{attrs["svg"]}</div>'
        )
    if "figure" in attrs and "revision" in attrs:  # widgets.chart.Chart: its latest figure
        return _chart(saved, attrs)
    if "_widget_data" in attrs:
        # plotly's FigureWidget sends later changes as messages that the saved state does not
        # keep: its _widget_data is the first figure, not the last, so drawing it would mislead.
        return _note("a live plotly chart, updated by the kernel")
    return _note(f"the interactive view {attrs.get('_anywidget_id', 'anywidget')}")


def _chart(saved: SavedWidgets, attrs: Mapping[str, Any]) -> str:
    import plotly.io as pio

    from .chart import figure_json, template_json

    figure = figure_json(attrs["figure"])
    figure["layout"] = {**figure["layout"], "template": template_json()}
    page = pio.to_html(
        figure,
        include_plotlyjs=not saved.plotly_on_page,
        full_html=False,
        config=dict(attrs.get("config") or {}),
        validate=False,
    )
    saved.plotly_on_page = True
    return page


_RENDERERS: dict[str, Callable[[SavedWidgets, Mapping[str, Any]], str]] = {
    "VBoxModel": _box("column"),
    "BoxModel": _box("column"),
    "GridBoxModel": _box("row"),
    "HBoxModel": _box("row"),
    "HTMLModel": _html_value,
    "HTMLMathModel": _html_value,
    "LabelModel": _label,
    "ButtonModel": _button,
    "TextModel": _text,
    "TextareaModel": _text,
    "IntTextModel": _text,
    "FloatTextModel": _text,
    "BoundedIntTextModel": _text,
    "BoundedFloatTextModel": _text,
    "DropdownModel": _dropdown,
    "SelectModel": _dropdown,
    "ToggleButtonsModel": _toggle_buttons,
    "CheckboxModel": _checkbox,
    "IntProgressModel": _progress,
    "FloatProgressModel": _progress,
    "AnyModel": _anywidget,
}
