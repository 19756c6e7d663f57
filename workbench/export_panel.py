"""The dashboard's export: the strategy shown, for Megatron-LM, DeepSpeed or torchtitan.

"Export" writes the file (``megatron_args.sh``, ``ds_config.json``, ``torchtitan.toml``)
in the notebook's folder and shows it with what the tool cannot express
(:mod:`workbench.export`). Annotations placed by hand are not a strategy these tools
take: the panel says so.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import ipywidgets as w

from ir.errors import DistIRError

from .export import TOOLS, Export, Plan, export, gpt_shape
from .session import Session

__all__ = ["ExportPanel"]

_LABELS = {"megatron": "Megatron-LM", "deepspeed": "DeepSpeed", "torchtitan": "torchtitan"}


class ExportPanel(w.VBox):
    """A tool, an "Export" button, the file written and the export's notes."""

    def __init__(
        self,
        session: Callable[[], Session],
        working: Callable[[str], AbstractContextManager[None]] = lambda _what: nullcontext(),
        folder: Path | None = None,
    ) -> None:
        self._session, self._working, self._folder = session, working, folder
        self.last: Export | None = None
        self.tool = w.Dropdown(
            options=[(_LABELS[t], t) for t in TOOLS], value="megatron", layout={"width": "140px"}
        )
        self.button = w.Button(description="Export", layout={"width": "80px"})
        self.button.tooltip = "write the strategy shown as the tool's command line or config"
        self.button.add_class("distir-export")
        self.button.on_click(lambda _b: self.write())
        self.status = w.HTML("")
        self.status.add_class("distir-export-status")
        self.text = w.Textarea(value="", layout={"width": "98%", "height": "150px"})
        self.text.add_class("distir-export-text")
        self.text.layout.display = "none"
        super().__init__(
            [
                w.HTML("<b>Export</b> the strategy shown"),
                w.HBox([self.tool, self.button], layout={"flex_flow": "row wrap"}),
                self.status,
                self.text,
            ],
            layout={"padding": "4px", "border": "1px solid #ddd", "margin": "6px 0 0 0"},
        )

    def write(self) -> Export | None:
        """What the button does: the export of the strategy shown, written to its file."""
        session = self._session()
        if session.state.annotations:
            self._say(
                "annotations are not a strategy of these tools: choose one in the ready "
                "transforms (or a point of the search) to export it",
                error=True,
            )
            return None
        with self._working(f"writing the {_LABELS[self.tool.value]} export…"):
            try:
                made = self._export(session)
            except (DistIRError, OSError) as e:
                self._say(str(e), error=True)
                return None
        self.last = made
        self.text.value = made.text
        self.text.layout.display = None
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in made.notes)
        self.status.value = f"<small>wrote {html.escape(made.filename)}</small>" + (
            f"<ul style='margin:2px 0;font-size:smaller'>{notes}</ul>" if notes else ""
        )
        return made

    def _export(self, session: Session) -> Export:
        base = session.base
        wte = next(v for v in base.inputs if v.name == "wte") if gpt_shape(base) else None
        dtype = getattr(getattr(wte, "type", None), "dtype", None)
        plan = Plan.of(session.strategy, dtype=getattr(dtype, "name", "float32"))
        made = export(self.tool.value, plan, gpt_shape(base))
        (self._folder or Path.cwd()).joinpath(made.filename).write_text(made.text, encoding="utf-8")
        return made

    def _say(self, text: str, *, error: bool = False) -> None:
        color = "#b00020" if error else "#555"
        self.status.value = f"<small style='color:{color}'>{html.escape(text)}</small>"
        self.text.layout.display = "none"
