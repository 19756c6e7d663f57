"""Saved widget state drawn as static HTML (widgets.saved_widget), for the offline course."""

from __future__ import annotations

from widgets.saved_widget import SavedWidgets


def _model(name: str, **state: object) -> dict:
    return {"model_name": name, "state": state}


STATE = {
    "box": _model("VBoxModel", children=["IPY_MODEL_title", "IPY_MODEL_row", "IPY_MODEL_gone"]),
    "title": _model("HTMLModel", value="<b>step time 54.01 µs</b>", description=""),
    "row": _model(
        "HBoxModel",
        children=["IPY_MODEL_apply", "IPY_MODEL_axis", "IPY_MODEL_mesh", "IPY_MODEL_view"],
    ),
    "apply": _model("ButtonModel", description="Apply", button_style="primary"),
    "axis": _model(
        "DropdownModel", description="axis 0", _options_labels=["R", "S(0)", "S(1)"], index=2
    ),
    "mesh": _model("TextModel", description="mesh", value='2x4 "q"'),
    "view": _model("ToggleButtonsModel", _options_labels=["program", "per device"], index=1),
    "gone": _model("HTMLModel", value="hidden text", layout="IPY_MODEL_hidden_layout"),
    "hidden_layout": _model("LayoutModel", display="none"),
    "bar": _model("FloatProgressModel", value=6.0, max=6.0, description="simulating"),
    "graph": _model("AnyModel", svg="<svg id='g'></svg>", legend_html="<div>legend</div>"),
    "plot": _model(
        "AnyModel",
        _widget_data=[{"type": "bar", "x": [1, 2], "y": [3, 4]}],
        _widget_layout={"height": 220},
    ),
    "chart": _model(
        "AnyModel",
        figure={
            "data": [
                {
                    "type": "bar",
                    "x": [1, 2],
                    "y": [3, 4],
                    "hovertext": {
                        "strings": ["last"],
                        "index": {"dtype": "i4", "bdata": "AAAAAAAAAAA="},
                    },
                }
            ],
            "layout": {"height": 220, "title": {"text": "the latest figure"}},
        },
        revision=3,
        config={"displaylogo": False},
    ),
    "mystery": _model("AnyModel", _anywidget_id="some.View"),
    "odd": _model("ColorPickerModel", value="#fff"),
}


def test_a_dashboard_box_shows_its_children_and_values_statically():
    page = SavedWidgets(STATE).html("box")
    assert "<b>step time 54.01 µs</b>" in page  # HTML values are HTML
    assert "<button disabled" in page and "Apply" in page and "#2f6fb3" in page
    assert "<option selected>S(1)</option>" in page and "<option>R</option>" in page
    assert 'value="2x4 &quot;q&quot;"' in page  # values are escaped
    assert "font-weight:bold" in page.split("per device")[0].rsplit("<button", 1)[1]
    assert "hidden text" not in page  # a widget whose layout hides it is not drawn
    assert page.index("step time") < page.index("Apply") < page.index("axis 0")


def test_progress_and_graph_are_drawn_a_live_plotly_chart_is_a_note():
    saved = SavedWidgets(STATE)
    assert '<progress value="6.0" max="6.0">' in saved.html("bar")
    graph = saved.html("graph")
    assert "<svg id='g'></svg>" in graph and graph.index("legend") < graph.index("<svg")
    # a FigureWidget's saved data is its first figure, not its last: not drawn
    plot = saved.html("plot")
    assert "live plotly chart" in plot and "Plotly" not in plot and "bar" not in plot


def test_a_chart_is_drawn_from_its_state_with_plotly_js_once_per_page():
    saved = SavedWidgets(STATE)
    first, second = saved.html("chart"), saved.html("chart")
    for page in (first, second):  # the latest figure, its strings table expanded
        assert "Plotly.newPlot" in page and "the latest figure" in page
        assert '"hovertext":["last","last"]' in page
    assert "plotly.js v" in first and "plotly.js v" not in second  # inlined once
    assert "plotly.js v" not in SavedWidgets(STATE, plotly_on_page=True).html("chart")


def test_what_cannot_be_drawn_says_so():
    saved = SavedWidgets(STATE)
    assert "some.View" in saved.html("mystery") and "run the notebook" in saved.html("mystery")
    assert "ColorPickerModel that has no static form" in saved.html("odd")
    assert "was not saved (nope)" in saved.html("nope")
