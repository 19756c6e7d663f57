"""The state a notebook's workbench holds, with undo and redo.

A :class:`Session` owns the program the user started from (the *base*
Function), the hardware (a Topology) and a :class:`State`: either a ready-made
strategy (data / horizontal / pipeline degrees) or a set of sharding
annotations on values of the base program. Every change goes through one path:

    new State -> derive (transform or propagate, then simulate) -> commit

If deriving fails, the error is kept in :attr:`Session.error` and the previous
state, program and simulation stay exactly as they were, so a bad click never
leaves the views half-updated. The last derived results are kept per State, so undo
and redo are instant.

No Jupyter import here: the dashboard listens with :meth:`Session.on_change`.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ir.device import Topology
from ir.errors import DistIRError
from ir.function import Function
from ir.limits import MAX_DEVICES, MAX_INT

from .lru import KEEP, Lru

if TYPE_CHECKING:
    from ir.sharding import ProgramFacts

Annotation = Any
"""``(ir.sharding.Mesh, placements)`` or an ``ir.sharding.ShardingSpec``."""

SCHEDULES = ("gpipe", "1f1b")
STRATEGY_KEYS = ("dp", "hp", "pp", "microbatches", "schedule", "ep", "cp", "zero")


def _shown(value: Any) -> str:
    """``repr(value)``, short (and an int too long to print said as such)."""
    try:
        text = repr(value)
    except ValueError:  # an int past Python's 4,300 digits
        return f"an integer of {value.bit_length()} bits"
    return text if len(text) <= 60 else text[:57] + "..."


class SessionError(DistIRError):
    """A request the session cannot carry out (unknown value, bad degree, nothing to undo)."""


class ListenerWarning(RuntimeWarning):
    """A change listener (``Session.on_change``) raised; the change itself stands."""


class UnknownValueError(SessionError, KeyError):
    """A value name that is not in the session's program (a KeyError too, as it was)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class NothingToCompareError(SessionError, KeyError):
    """A comparison with the previous state when there is none yet (a KeyError too, as
    it was)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class Strategy:
    """The ready transforms' knobs: ``dp x cp x hp x pp`` devices, microbatches, schedule;
    ``ep`` expert-parallel ranks among the ``dp`` replicas (a mixture-of-experts model),
    ``cp`` context-parallel ranks per sequence and the ZeRO stage ``zero`` (0 to 3), all
    applied by ``T.megatron`` (docs/experts.md).

    >>> Strategy(dp=2, pp=2, microbatches=4).describe()
    'dp=2 x pp=2, 4 microbatches (gpipe)'
    >>> Strategy(dp=4, hp=2, ep=2, cp=2, zero=3).describe()
    'dp=4 x cp=2 x hp=2, ep=2, ZeRO-3'
    >>> Strategy().describe()
    'sequential'
    """

    dp: int = 1
    hp: int = 1
    pp: int = 1
    microbatches: int = 1
    schedule: str = "gpipe"
    ep: int = 1
    cp: int = 1
    zero: int = 0

    def __post_init__(self) -> None:
        for name in ("dp", "hp", "pp", "microbatches", "ep", "cp"):
            value = getattr(self, name)
            most = MAX_DEVICES if name != "microbatches" else MAX_INT
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
                raise SessionError(
                    f"strategy: {name} must be a positive integer, got {_shown(value)} "
                    f"(at most {most})"
                )
        if self.num_devices > MAX_DEVICES:
            raise SessionError(
                f"strategy: dp x cp x hp x pp = {self.num_devices} devices, more than "
                f"{MAX_DEVICES} (ir.limits.MAX_DEVICES)"
            )
        if self.dp % self.ep:
            raise SessionError(
                f"strategy: ep={self.ep} must divide dp={self.dp} (an expert group is ep of "
                "the data-parallel replicas); choose ep dividing dp"
            )
        zero = self.zero
        if isinstance(zero, bool) or not isinstance(zero, int) or zero not in (0, 1, 2, 3):
            raise SessionError(f"strategy: zero must be 0, 1, 2 or 3, got {_shown(zero)}")
        if not isinstance(self.schedule, str) or self.schedule not in SCHEDULES:
            raise SessionError(
                f"strategy: schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}"
            )

    @property
    def num_devices(self) -> int:
        """Devices the strategy uses: ``dp * cp * hp * pp``."""
        return self.dp * self.cp * self.hp * self.pp

    @property
    def is_sequential(self) -> bool:
        """True when no transform applies (every degree 1)."""
        return self.num_devices == 1

    def describe(self) -> str:
        """A short human label, e.g. ``dp=2 x hp=4``."""
        if self.is_sequential:
            return "sequential"
        degrees = ("dp", "cp", "hp", "pp")
        text = " x ".join(f"{k}={getattr(self, k)}" for k in degrees if getattr(self, k) > 1)
        if self.pp > 1:
            text += f", {self.microbatches} microbatches ({self.schedule})"
        if self.ep > 1:
            text += f", ep={self.ep}"
        if self.zero:
            text += f", ZeRO-{self.zero}"
        return text

    @staticmethod
    def parse(text: str) -> Strategy:
        """``"dp=2,hp=2,pp=2,microbatches=4,schedule=1f1b"`` (any subset, with ``ep``,
        ``cp`` and ``zero`` too; ``""`` = sequential).

        >>> Strategy.parse("dp=2, pp=2, schedule=1f1b")
        Strategy(dp=2, hp=1, pp=2, microbatches=1, schedule='1f1b', ep=1, cp=1, zero=0)

        A key given twice is refused (which one was meant?).
        """
        if not isinstance(text, str):
            raise SessionError(f"strategy must be text such as 'dp=2,pp=2', got {_shown(text)}")
        fields: dict[str, Any] = {}
        for part in text.replace(";", ",").split(","):
            part = part.strip()
            if not part or part == "sequential":
                continue
            key, sep, value = part.partition("=")
            key = key.strip().lower()
            if not sep or key not in STRATEGY_KEYS:
                raise SessionError(
                    f"strategy {_shown(text)}: cannot read {part!r}; write key=value with keys "
                    f"{', '.join(STRATEGY_KEYS)} (e.g. 'dp=2,pp=2,microbatches=4')"
                )
            value = value.strip()
            if key in fields:
                raise SessionError(
                    f"strategy {_shown(text)}: {key} is given twice ({key}={fields[key]} and "
                    f"{key}={value}); give each key once"
                )
            if key == "schedule":
                fields[key] = value.lower()
            else:
                if not (value.isascii() and value.isdigit() and len(value) <= 19):
                    raise SessionError(
                        f"strategy {_shown(text)}: {key} must be a "
                        f"{'stage, 0 to 3' if key == 'zero' else 'positive integer'}, got {value!r}"
                    )
                fields[key] = int(value)
        return Strategy(**fields)


@dataclass(frozen=True)
class State:
    """What the user chose: a strategy, or annotations (value name -> placement)."""

    strategy: Strategy = Strategy()
    annotations: tuple[tuple[str, Annotation], ...] = ()

    def annotation(self, value_name: str) -> Annotation | None:
        """The annotation on ``value_name``, if any."""
        return dict(self.annotations).get(value_name)

    def with_annotation(self, value_name: str, spec: Annotation) -> State:
        """This state plus ``value_name: spec`` (replacing an earlier one); strategy reset.

        ``spec`` is kept in one form (:func:`normal_annotation`), so equal choices make
        equal states whichever way they were written."""
        rest = tuple((n, s) for n, s in self.annotations if n != value_name)
        return State(Strategy(), (*rest, (value_name, normal_annotation(value_name, spec))))

    def without_annotation(self, value_name: str) -> State:
        """This state without the annotation on ``value_name``."""
        return replace(self, annotations=tuple(a for a in self.annotations if a[0] != value_name))

    def with_strategy(self, strategy: Strategy) -> State:
        """The ready strategy ``strategy``; annotations are dropped (they are another mode)."""
        return State(strategy, ())

    def describe(self) -> str:
        """A short label: the strategy, or the annotated values."""
        if self.annotations:
            return "annotated: " + ", ".join(describe_annotation(n, s) for n, s in self.annotations)
        return self.strategy.describe()


@dataclass(frozen=True)
class Derived:
    """A State worked out: the program it gives, its simulation, and timings."""

    state: State
    function: Function
    result: Any  # ir.sim's result: step_time_s, peak_memory_bytes, events, ...
    collectives: tuple[Any, ...] = ()  # redistributions propagation inserted
    report: Any = None  # propagation's report (layouts per value), when annotated
    derive_s: float = 0.0  # Python time to transform or propagate
    simulate_s: float = 0.0  # Python time to simulate


def normal_annotation(value_name: str, spec: Annotation) -> Annotation:
    """``spec`` as ``(Mesh, tuple of placements)`` or a ShardingSpec (what a session keeps
    and a session file holds); a Layout, a mesh given by its shape, placements as text or
    in a list are converted. Anything else is a SessionError naming the value.

    >>> from ir.sharding import Mesh, S
    >>> normal_annotation("wA", ((4,), ["S(1)"])) == (Mesh((4,)), (S(1),))
    True
    """
    from ir.sharding import Layout, Mesh, ShardingSpec, placement

    if isinstance(spec, ShardingSpec):
        return spec
    if isinstance(spec, Layout):
        return spec.mesh, tuple(spec.placements)
    if isinstance(spec, tuple) and len(spec) == 2:
        mesh, placements = spec
        if isinstance(placements, str):
            placements = [placements]
        try:
            if not isinstance(mesh, Mesh):
                mesh = Mesh(mesh)
            if isinstance(placements, list | tuple):
                return mesh, tuple(placement(p) for p in placements)
        except DistIRError as e:
            raise SessionError(f"annotation of {value_name!r}: {e}") from None
        except (TypeError, ValueError, AttributeError, OverflowError, MemoryError) as e:
            raise SessionError(
                f"annotation of {value_name!r}: cannot read {spec!r}: {type(e).__name__}"
            ) from None
    raise SessionError(
        f"annotation of {value_name!r} must be (Mesh, placements), a Layout or a "
        f"ShardingSpec, got {spec!r}"
    )


def describe_annotation(value_name: str, spec: Annotation) -> str:
    """``wA: mesh (2,) [S(1)]`` for a mesh placement, ``wA: <spec>`` for an ONNX spec."""
    if isinstance(spec, tuple) and len(spec) == 2:
        mesh, placements = spec
        shape = getattr(mesh, "shape", mesh)
        return f"{value_name}: mesh {tuple(shape)} [{', '.join(str(p) for p in placements)}]"
    return f"{value_name}: {spec}"


def derive(
    base: Function, topology: Topology, state: State, facts: ProgramFacts | None = None
) -> Derived:
    """Apply ``state`` to ``base`` (transform or propagate) and simulate the result.

    ``facts``: the ``ir.sharding.ProgramFacts`` of ``base`` kept by a caller that derives
    it again (a session: each click propagates ``base`` on a new mesh or annotation);
    propagation makes a fresh one when None.
    """
    import ir.sim as sim

    start = time.perf_counter()
    collectives: tuple[Any, ...] = ()
    report = None
    if state.annotations:
        from ir.sharding import propagate

        function, report = propagate(base, dict(state.annotations), topology=topology, facts=facts)
        collectives = tuple(_collectives_of(report))
    elif state.strategy.is_sequential:
        function = base
    else:
        _check_fits(state.strategy, topology)
        function = _apply_strategy(base, state.strategy)
    derived_at = time.perf_counter()
    result = sim.simulate(function, topology)
    done = time.perf_counter()
    return Derived(
        state, function, result, collectives, report, derived_at - start, done - derived_at
    )


def _check_fits(strategy: Strategy, topology: Topology) -> None:
    """A strategy needs ``dp * cp * hp * pp`` devices; say so before a transform fails on
    the first value it cannot place."""
    have = len(topology.devices)
    if strategy.num_devices > have:
        raise SessionError(
            f"{strategy.describe()} needs dp x cp x hp x pp = {strategy.num_devices} devices, but "
            f"{topology.name} has {have}: lower the degrees so that their product is at most "
            f"{have}, or simulate more devices (report: --devices {strategy.num_devices})"
        )


def _apply_strategy(base: Function, strategy: Strategy) -> Function:
    from ir import transforms

    return transforms.parallelize(
        base,
        dp=strategy.dp,
        hp=strategy.hp,
        pp=strategy.pp,
        microbatches=strategy.microbatches,
        schedule=strategy.schedule,
        zero=strategy.zero,
        ep=strategy.ep,
        cp=strategy.cp,
    )


def _collectives_of(report: Any) -> list[Any]:
    if report is None:
        return []
    for attr in ("collectives", "inserted"):
        if hasattr(report, attr):
            return list(getattr(report, attr))
    return list(report) if isinstance(report, list | tuple) else [report]


def _cache_key(state: State) -> Any:
    # Specs with a dict device_map are not hashable; their repr identifies them.
    try:
        hash(state)
    except TypeError:
        return repr(state)
    return state


@dataclass
class _History:
    undo: list[State] = field(default_factory=list)
    redo: list[State] = field(default_factory=list)


class Session:
    """A program, a topology and the user's choices, with undo and redo.

    ``Session(f, topology)`` simulates ``f`` as given. :meth:`annotate`,
    :meth:`unannotate` and :meth:`set_strategy` return True when the change
    applied; on failure they return False, put the message in :attr:`error`
    and keep the previous state.
    """

    def __init__(
        self,
        function: Function,
        topology: Topology,
        *,
        strategy: Strategy | None = None,
        state: State | None = None,
    ) -> None:
        from ir.sharding import ProgramFacts

        self.base = function
        self.topology = topology
        # the base program's rules and op signatures, read by its first propagation and
        # reused by every later one (they depend on no mesh or annotation)
        self._facts = ProgramFacts(function)
        self.error: str | None = None
        # the states derived last (Undo, Redo and search picks instant); older ones derive
        # again when they come back
        self._cache: Lru[Any, Derived] = Lru(KEEP)
        self._history = _History()
        self._listeners: list[Callable[[Session], None]] = []
        self.listener_errors: list[Exception] = []  # what listeners raised at the last change
        # The first state must derive: there is no earlier one to fall back to.
        self._current = self._derive(state or State(strategy or Strategy()))

    # -- files -----------------------------------------------------------------------------

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the program, topology, state and undo/redo history to ``path`` as JSON
        (``workbench.session_file``); atomic: a failure leaves an earlier file intact."""
        from . import session_file

        h = self._history
        return session_file.save(path, self.base, self.topology, self.state, h.undo, h.redo)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Session:
        """The session saved at ``path`` (:meth:`save`): its program, topology, state and
        history; a file that cannot be read or does not apply raises SessionFileError."""
        from .session_file import SessionFileError, read

        saved = read(path)
        try:
            session = cls(saved.function, saved.topology, state=saved.state)
        except Exception as e:  # the file's state is checked, but deriving may still refuse it
            kind = "" if isinstance(e, DistIRError) else f"{type(e).__name__}: "
            field = "$.annotations" if saved.state.annotations else "$.strategy"
            raise SessionFileError(
                path, field, f"the saved state does not apply: {kind}{e}"
            ) from None
        session._history = _History(list(saved.undo), list(saved.redo))
        return session

    def restore(self, path: str | os.PathLike[str]) -> bool:
        """Replace this session's program, topology, state and history by those saved at
        ``path``, keeping its listeners. False (with :attr:`error` set, nothing changed)
        when the file cannot be loaded."""
        try:
            other = Session.load(path)
        except DistIRError as e:
            return self._fail(str(e))
        self.adopt(other)
        return True

    def adopt(self, other: Session) -> None:
        """Take over ``other``'s program, topology, state, history and cache (one change
        to listeners; this session's own history is replaced, not extended)."""
        self.base, self.topology, self._facts = other.base, other.topology, other._facts
        self._cache, self._history, self._current = other._cache, other._history, other._current
        self._changed()

    # -- what the views read -----------------------------------------------------------

    @property
    def current(self) -> Derived:
        """The derived state on display."""
        return self._current

    @property
    def state(self) -> State:
        return self._current.state

    @property
    def function(self) -> Function:
        """The program on display (transformed or propagated)."""
        return self._current.function

    @property
    def result(self) -> Any:
        """The simulation of :attr:`function` on :attr:`topology`."""
        return self._current.result

    @property
    def annotations(self) -> dict[str, Annotation]:
        return dict(self._current.state.annotations)

    @property
    def strategy(self) -> Strategy:
        return self._current.state.strategy

    @property
    def previous(self) -> Derived | None:
        """The state before the last change (what Undo would show), or None."""
        return self._derive(self._history.undo[-1]) if self._history.undo else None

    @property
    def can_undo(self) -> bool:
        return bool(self._history.undo)

    @property
    def can_redo(self) -> bool:
        return bool(self._history.redo)

    def annotatable(self) -> list[str]:
        """Names of base-program values that accept an annotation (inputs, op results)."""
        names = [v.name for v in self.base.inputs]
        names += [v.name for op in self.base.ops for v in op.outputs]
        return list(dict.fromkeys(names))

    def on_change(self, callback: Callable[[Session], None]) -> None:
        """Call ``callback(session)`` after every change, failed ones included.

        The change is committed first: a callback that raises does not undo it nor
        make the method report failure; its exception goes to :attr:`listener_errors`
        and a :class:`ListenerWarning` is issued, and later callbacks still run."""
        self._listeners.append(callback)

    def off_change(self, callback: Callable[[Session], None]) -> None:
        """Stop calling ``callback`` (one :meth:`on_change` gave); unknown ones are ignored."""
        if callback in self._listeners:
            self._listeners.remove(callback)

    # -- changes -------------------------------------------------------------------------

    def annotate(self, value_name: str, spec: Annotation) -> bool:
        """Place ``value_name`` (a value of the base program) as ``spec`` and propagate."""
        if not isinstance(value_name, str) or value_name not in self.annotatable():
            return self._fail(
                f"cannot annotate {value_name!r}: it is not a value of the program "
                f"{self.base.name!r}; choose one of {', '.join(self.annotatable()[:12])}"
                + (", ..." if len(self.annotatable()) > 12 else "")
            )
        try:
            new = self.state.with_annotation(value_name, spec)
        except SessionError as e:
            return self._fail(str(e))
        return self._commit(new, f"annotating {describe_annotation(value_name, spec)}")

    def annotate_many(self, annotations: dict[str, Annotation], what: str = "") -> bool:
        """Place several values at once, as one change (one undo step)."""
        known = set(self.annotatable())
        unknown = [name for name in annotations if not isinstance(name, str) or name not in known]
        if unknown:
            return self._fail(f"cannot annotate {unknown}: not values of {self.base.name!r}")
        new = self.state
        try:
            for name, spec in annotations.items():
                new = new.with_annotation(name, spec)
        except SessionError as e:
            return self._fail(str(e))
        shown = ", ".join(describe_annotation(n, s) for n, s in annotations.items())
        return self._commit(new, what or f"annotating {shown}")

    def unannotate(self, value_name: str) -> bool:
        """Drop the annotation on ``value_name``."""
        if self.state.annotation(value_name) is None:
            return self._fail(f"{value_name!r} has no annotation to remove")
        return self._commit(self.state.without_annotation(value_name), f"removing {value_name}")

    def set_strategy(self, strategy: Strategy | None = None, **knobs: Any) -> bool:
        """Switch to a ready strategy: ``set_strategy(dp=2, pp=2, microbatches=4)``."""
        try:
            if isinstance(strategy, str):  # "dp=2, pp=2", as Strategy.parse reads it
                strategy = Strategy.parse(strategy)
            elif strategy is not None and not isinstance(strategy, Strategy):
                raise SessionError(
                    f"set_strategy: strategy must be a Strategy, a string such as 'dp=2,pp=2' "
                    f"or None, got {strategy!r}"
                )
            strategy = replace(strategy or Strategy(), **knobs)
        except (DistIRError, TypeError) as e:
            return self._fail(str(e))
        return self._commit(self.state.with_strategy(strategy), f"strategy {strategy.describe()}")

    def undo(self) -> bool:
        """Go back one change. False (with :attr:`error` set) when there is none."""
        if not self._history.undo:
            return self._fail("nothing to undo")
        return self._step(self._history.undo, self._history.redo, "undo")

    def redo(self) -> bool:
        """Re-apply the change last undone."""
        if not self._history.redo:
            return self._fail("nothing to redo")
        return self._step(self._history.redo, self._history.undo, "redo")

    # -- internals -------------------------------------------------------------------------

    def _step(self, source: list[State], target: list[State], what: str) -> bool:
        # Cached states derive at once; one loaded from a file may not derive at all.
        try:
            derived = self._derive(source[-1])
        except Exception as e:
            kind = "" if isinstance(e, DistIRError) else f"{type(e).__name__}: "
            return self._fail(f"{what} failed: {kind}{e}")
        source.pop()
        target.append(self.state)
        self._current = derived
        return self._changed()

    def _derive(self, state: State) -> Derived:
        return self._cache.get(
            _cache_key(state), lambda: derive(self.base, self.topology, state, self._facts)
        )

    def _commit(self, state: State, what: str) -> bool:
        if state == self.state:
            self.error = None
            return self._changed()
        try:
            derived = self._derive(state)
        except Exception as e:  # any failure, ours or a bug elsewhere, must keep the state
            kind = "" if isinstance(e, DistIRError) else f"{type(e).__name__}: "
            return self._fail(f"{what} failed: {kind}{e}")
        self._history.undo.append(self.state)
        self._history.redo.clear()
        self._current = derived
        return self._changed()

    def _changed(self) -> bool:
        self.error = None
        self._notify()
        return True

    def _fail(self, message: str) -> bool:
        self.error = message
        self._notify()
        return False

    def _notify(self) -> None:
        # A change is committed before listeners hear of it: one that raises must not make
        # the change look failed, nor keep the others from hearing it. Its error is kept
        # in listener_errors and reported as a ListenerWarning.
        self.listener_errors.clear()
        for callback in self._listeners:
            try:
                callback(self)
            except Exception as e:
                self.listener_errors.append(e)
                name = getattr(callback, "__qualname__", repr(callback))
                warnings.warn(
                    f"session listener {name} raised {type(e).__name__}: {e} (the session's "
                    "state is as the change left it)",
                    ListenerWarning,
                    stacklevel=4,
                )
