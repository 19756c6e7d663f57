"""Feedback on every wait: what the dashboard shows while it works, and the long actions
it runs off the kernel's main thread so that their Cancel button is heard.

:class:`Activity` is the line at the top of the dashboard: a spinner and what is being
done (with a progress bar and a Cancel button for long actions), every action button
disabled meanwhile so that a second click cannot start a second change. A short action
(Apply, Undo, a strategy) runs in the click's own handler: the kernel sends the "working"
state before it starts, so the browser shows it at once. A long one (search, measure)
runs in a :class:`Task`: a thread of the kernel, which keeps answering the browser, so a
click on Cancel reaches it. A task is cancelled cooperatively (:mod:`ir.interrupt`):
Cancel sets the task's event, and the work raises ``KeyboardInterrupt`` at its next
safe point, as Ctrl-C would stop a script (``ir.search.search`` then returns the rows it
has; a measurement stops its worker processes). Nothing is injected into the running
thread: an exception thrown in from outside can land inside a lock's bookkeeping (the
``logging`` module's) and leave the kernel deadlocked.
"""

from __future__ import annotations

import html
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import ipywidgets as w

from ir.interrupt import cancellable

__all__ = ["Activity", "Task"]

SPINNER_CSS = (
    "<style>.distir-spin{display:inline-block;width:12px;height:12px;margin-right:6px;"
    "vertical-align:-2px;border:2px solid #c8c8c8;border-top-color:#2f6fb3;border-radius:50%;"
    "animation:distir-spin .8s linear infinite}@keyframes distir-spin{to{transform:"
    "rotate(360deg)}}</style>"
)


class Task:
    """``work()`` run in a thread of the kernel; ``done(result, error)`` is called there
    when it returns (``error``: what it raised, a ``KeyboardInterrupt`` if cancelled).

    >>> task = Task(lambda: 6 * 7, lambda result, error: None)
    >>> task.start().join(5)
    >>> task.result, task.error
    (42, None)
    """

    def __init__(
        self, work: Callable[[], Any], done: Callable[[Any, BaseException | None], None]
    ) -> None:
        self._work, self._done = work, done
        self.result: Any = None
        self.error: BaseException | None = None
        self.cancelled = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="distir-task", daemon=True)

    def start(self) -> Task:
        self._thread.start()
        return self

    def join(self, timeout_s: float | None = None) -> None:
        """Wait for the task (and its ``done``) to finish."""
        self._thread.join(timeout_s)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def cancel(self) -> None:
        """Ask the work to stop: it raises ``KeyboardInterrupt`` at its next safe point
        (:func:`ir.interrupt.check`), as Ctrl-C would."""
        if not self.running or self.cancelled:
            return
        self.cancelled = True
        self._stop.set()

    def _run(self) -> None:
        try:
            with cancellable(self._stop):
                self.result = self._work()
        except BaseException as e:  # reported to done(), which shows it
            self.error = e
        self._done(self.result, self.error)


class Activity(w.HBox):
    """The dashboard's "working" line: spinner, message, progress and Cancel. ``buttons()``
    returns the action buttons to disable while it works; ``restore()`` sets them as they
    should be afterwards (Undo enabled after a change, Redo not, ...)."""

    def __init__(self, buttons: Callable[[], list[w.Button]], restore: Callable[[], None]) -> None:
        self._buttons, self._restore = buttons, restore
        self.message = w.HTML("")
        self.message.add_class("distir-activity-message")
        self.progress = w.IntProgress(value=0, min=0, max=1, layout={"width": "180px"})
        self.progress.add_class("distir-activity-progress")
        self.cancel_button = w.Button(
            description="Cancel", button_style="warning", layout={"width": "80px"}
        )
        self.cancel_button.add_class("distir-cancel")
        self.cancel_button.on_click(lambda _b: self.cancel())
        self.task: Task | None = None
        self.busy = False
        self.last_s = 0.0  # how long the last action took
        super().__init__([self.message], layout={"min_height": "24px", "align_items": "center"})
        self.add_class("distir-activity")

    @contextmanager
    def working(self, what: str) -> Iterator[None]:
        """Show ``what`` (with a spinner) and disable every action button while the block
        runs (a short action, in the click's handler)."""
        self._begin(what, cancellable=False)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.last_s = time.perf_counter() - start
            self._end("")

    def run(
        self,
        what: str,
        work: Callable[[], Any],
        done: Callable[[Any, BaseException | None], None],
    ) -> Task:
        """Start a long action: ``work`` in a :class:`Task`, Cancel shown; ``done(result,
        error)`` runs when it ends, then the line clears (``done`` may leave a message by
        returning normally after calling :meth:`say`)."""
        self._begin(what, cancellable=True)
        start = time.perf_counter()

        def finish(result: Any, error: BaseException | None) -> None:
            self.last_s = time.perf_counter() - start
            note = ""
            try:
                done(result, error)
            except Exception as e:
                note = f"{type(e).__name__}: {e}"
            self.task = None
            self._end(note)

        self.task = Task(work, finish)
        return self.task.start()

    def step(self, done: int, total: int, what: str = "") -> None:
        """Progress of the long action: ``done`` of ``total`` (a bar; none for a total of
        0), and a new message."""
        if what:
            self._say(what, spinning=True)
        if total <= 0:
            return
        self.progress.max = max(total, 1)
        self.progress.value = min(done, self.progress.max)
        self.progress.description = f"{done}/{total}"
        if self.progress not in self.children:
            self.children = (*self.children[:1], self.progress, *self.children[1:])

    def cancel(self) -> None:
        """What the Cancel button does."""
        if self.task is not None:
            self._say("cancelling…", spinning=True)
            self.task.cancel()

    def say(self, text: str, *, error: bool = False) -> None:
        """Leave a message on the line (an outcome, or why an action did not run)."""
        self._say(text, error=error)

    def _begin(self, what: str, *, cancellable: bool) -> None:
        self.busy = True
        for button in self._buttons():
            button.disabled = True
        self._say(what, spinning=True)
        self.children = (self.message, self.cancel_button) if cancellable else (self.message,)

    def _end(self, note: str) -> None:
        self.busy = False
        for button in self._buttons():
            button.disabled = False
        self._restore()
        self.children = (self.message,)
        if note:
            self._say(note, error=True)
        elif "distir-spin" in self.message.value:
            self.message.value = ""

    def _say(self, text: str, *, spinning: bool = False, error: bool = False) -> None:
        spin = f"{SPINNER_CSS}<span class='distir-spin'></span>" if spinning else ""
        color = "#b00020" if error else "#333"
        self.message.value = f"{spin}<span style='color:{color}'>{html.escape(text)}</span>"
