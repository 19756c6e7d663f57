"""The op registry: ONE record (:class:`OpDef`) per op type.

Everything the system knows about an op lives in its record, registered next
to its rules in ``ir/ops/<family>.py``: signature, shape/type rule, numpy
kernel, cost rule, and the sharding and gradient rules that propagation and
autodiff read. Nothing else keys behaviour by op-name strings.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from .attr_kinds import AttrKind
from .errors import RegistryError, UnknownOpError
from .types import Type

if TYPE_CHECKING:
    from .function import Function


class OpKind(enum.Enum):
    """How the simulator and the views treat an op."""

    COMPUTE = "compute"  # runs on one device's compute stream
    COMMUNICATION = "communication"  # moves data between devices
    CONTROL = "control"  # pmap, tuple access, constants: structure, no data movement


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


@dataclass(frozen=True)
class Attr:
    """An attribute in an op's signature; ``default`` is ``REQUIRED`` when it has none."""

    name: str
    default: Any = REQUIRED
    doc: str = ""
    aliases: tuple[str, ...] = ()  # other spellings the seeds use (``device`` for ``to_device``)
    kind: AttrKind | None = None  # the values it takes; the checker refuses others


@dataclass(frozen=True)
class Cost:
    """What one execution of an op costs: floating-point operations and memory traffic.

    ``matrix_flops`` is the part of ``flops`` done as matrix products (MatMul,
    convolutions): the simulator times it at the device's matrix (tensor-core)
    peak for the operands' element type and the rest at its vector peak (see
    ``ir.device``). An op's cost rule is the one place that says so.

    What a kernel efficiency model (``ir.hardware.kernels``) needs besides:
    ``gemms`` lists the matrix products as ``(batch, m, n, k)`` (for a fused attention,
    one entry ``(batch * heads, query length, key length, head dimension)``);
    ``kernel`` names the kind of kernel (one of ``ir.hardware.kernels.KERNEL_KINDS``:
    ``"view"`` launches nothing, ``"optimizer"`` is one weight's share of a fused
    multi-tensor step, ``"attention"`` / ``"attention_grad"`` a fused attention; ``""``
    infers a GEMM from ``gemms``, else a memory-bound kernel); ``launches`` counts the
    kernels the op runs (a MatMulGrad runs two products).
    """

    flops: float = 0.0
    bytes_read: float = 0.0
    bytes_written: float = 0.0
    matrix_flops: float = 0.0
    gemms: tuple[tuple[int, int, int, int], ...] = ()
    kernel: str = ""
    launches: int = 1

    def __add__(self, other: Cost) -> Cost:
        return Cost(
            self.flops + other.flops,
            self.bytes_read + other.bytes_read,
            self.bytes_written + other.bytes_written,
            self.matrix_flops + other.matrix_flops,
            self.gemms + other.gemms,
            self.kernel if self.kernel == other.kernel else "",
            self.launches + other.launches,
        )


def ops_cost(ops: Iterable[Any]) -> Cost:
    """The summed cost of ``ops`` as their records' cost rules give it (ops without a
    rule, and pmap bodies, count nothing: a step's top level, not its devices)."""
    flops = read = written = matrix = 0.0
    launches = 0
    for op in ops:
        rule = get_op(op.op_type).cost_rule
        if rule is None or op.subfunctions:
            continue
        types_in = tuple(v.type for v in op.inputs)
        c = rule(CostContext(types_in, tuple(v.type for v in op.outputs), op.attributes))
        flops += c.flops
        read += c.bytes_read
        written += c.bytes_written
        matrix += c.matrix_flops
        launches += c.launches
    # totals only: the per-op GEMM shapes are not kept (a long program would list thousands)
    return Cost(flops, read, written, matrix, launches=launches)


@dataclass(frozen=True)
class TypeContext:
    """What a shape/type rule sees: operand types, attributes (defaults filled in), bodies."""

    input_types: tuple[Type, ...]
    attributes: Mapping[str, Any]
    subfunctions: tuple[Function, ...] = ()


@dataclass(frozen=True)
class CostContext:
    """What a cost rule sees: operand and result types and attributes."""

    input_types: tuple[Type, ...]
    output_types: tuple[Type, ...]
    attributes: Mapping[str, Any]


TypeRule = Callable[[TypeContext], Sequence[Type]]
Kernel = Callable[[Sequence[Any], Mapping[str, Any]], Sequence[Any]]
CostRule = Callable[[CostContext], Cost]


@dataclass(frozen=True)
class OpDef:
    """The one record of an op type.

    ``operands`` and ``results`` name the positional inputs and outputs; with
    ``variadic=True`` the last operand may repeat (zero or more times beyond
    the fixed ones). ``type_rule`` returns the result types and raises
    :class:`ir.errors.TypeRuleError` with a plain sentence when the operands do
    not fit. ``kernel`` computes results from numpy arrays (tuples of arrays
    for per-device tuple values). ``cost_rule`` gives flops and bytes.

    ``sharding_rule``, ``gradient_rule``, ``comm_rule`` and ``lower_rule`` are read
    by ``ir.sharding``, ``ir.transforms``, ``ir.sim`` and ``ir.sharding.lower``;
    their signatures are documented there. A family module may set them after the
    record is registered with :func:`attach_rule`, keeping each rule next to its op
    (a communication op's ``lower_rule``, which writes rank ops, is attached by
    ``ir.sharding.lower_comm``).
    """

    name: str
    operands: tuple[str, ...]
    results: tuple[str, ...]
    type_rule: TypeRule
    kernel: Kernel | None
    cost_rule: CostRule
    attributes: tuple[Attr, ...] = ()
    variadic: bool = False
    kind: OpKind = OpKind.COMPUTE
    aliases: tuple[str, ...] = ()
    doc: str = ""
    sharding_rule: Callable[..., Any] | None = None
    gradient_rule: Callable[..., Any] | None = None
    comm_rule: Callable[..., Any] | None = None
    lower_rule: Callable[..., Any] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def attribute_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.attributes)

    def check_arity(self, num_inputs: int) -> str | None:
        """None if ``num_inputs`` operands fit the signature, else a sentence saying why not."""
        fixed = len(self.operands) - (1 if self.variadic else 0)
        if self.variadic and num_inputs >= fixed:
            return None
        if not self.variadic and num_inputs == len(self.operands):
            return None
        want = f"at least {fixed}" if self.variadic else str(len(self.operands))
        names = ", ".join(self.operands) + (", ..." if self.variadic else "")
        return f"{self.name} takes {want} operand(s) ({names}), got {num_inputs}"

    def complete_attributes(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """``given`` with defaults filled in; raises on unknown or missing attributes."""
        known = self.attribute_names
        spelled = {alias: a.name for a in self.attributes for alias in a.aliases}
        given = {spelled.get(k, k): v for k, v in given.items()}
        unknown = [k for k in given if k not in known]
        if unknown:
            allowed = ", ".join(known) or "none"
            raise RegistryError(
                f"{self.name} has no attribute {unknown[0]!r} (its attributes: {allowed})"
            )
        out = {}
        for a in self.attributes:
            if a.name in given:
                out[a.name] = given[a.name]
            elif a.default is REQUIRED:
                raise RegistryError(f"{self.name} needs the attribute {a.name!r}")
            else:
                out[a.name] = a.default
        return out


_REGISTRY: dict[str, OpDef] = {}
_LOOKUP: dict[str, OpDef] = {}  # lower-cased names and aliases -> record


def register_op(opdef: OpDef) -> OpDef:
    """Add an op record. A name or alias already taken (in any letter case) is an error."""
    for key in (opdef.name, *opdef.aliases):
        if key.lower() in _LOOKUP:
            other = _LOOKUP[key.lower()].name
            raise RegistryError(f"op name {key!r} is already registered (by {other})")
    _REGISTRY[opdef.name] = opdef
    for key in (opdef.name, *opdef.aliases):
        _LOOKUP[key.lower()] = opdef
    return opdef


_RULE_FIELDS = ("sharding_rule", "gradient_rule", "comm_rule", "lower_rule")


def attach_rule(name: str, field_name: str, rule: Callable[..., Any]) -> OpDef:
    """Set one of an op's optional rules; setting a rule twice is an error."""
    if field_name not in _RULE_FIELDS:
        raise RegistryError(f"{field_name!r} is not a rule field (one of {_RULE_FIELDS})")
    old = _LOOKUP.get(name.lower())
    if old is None:
        raise RegistryError(f"cannot attach {field_name} to unknown op {name!r}")
    if getattr(old, field_name) is not None:
        raise RegistryError(f"{old.name} already has a {field_name}")
    new = replace(old, **{field_name: rule})
    _REGISTRY[old.name] = new
    for key in (old.name, *old.aliases):
        _LOOKUP[key.lower()] = new
    return new


def get_op(name: str) -> OpDef:
    """The record for ``name``, matched case-insensitively, aliases included."""
    _ensure_loaded()
    try:
        return _LOOKUP[name.lower()]
    except KeyError:
        raise UnknownOpError(_unknown_message(name)) from None


def has_op(name: str) -> bool:
    _ensure_loaded()
    return name.lower() in _LOOKUP


def all_ops() -> tuple[OpDef, ...]:
    """Every registered record, sorted by name."""
    _ensure_loaded()
    return tuple(_REGISTRY[k] for k in sorted(_REGISTRY))


def _unknown_message(name: str) -> str:
    import difflib

    close = difflib.get_close_matches(name, list(_REGISTRY), n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return f"unknown op {name!r}{hint} (ir.all_ops() lists the {len(_REGISTRY)} known ops)"


def _ensure_loaded() -> None:
    # The op families register themselves on import; importing here keeps
    # `get_op` usable from modules that were imported before `ir.ops`. Once that
    # import has run (or begun: a family may look an op up while it loads), importing
    # again does nothing, so the flag only skips the import statement's own cost:
    # builders look an op up for every op they add.
    global _ops_imported
    if not _ops_imported:
        from . import ops  # noqa: F401

        _ops_imported = True


_ops_imported = False


def op_table_markdown() -> str:
    """``docs/ops.md``: a Markdown table of every op (name, signature, attributes, doc).

    A test keeps the file equal to this function's output.
    """
    rows = [
        "# Ops",
        "",
        "One record per op in `ir.registry` (written in `ir/ops/<family>.py`); `name...` is",
        "variadic, attributes without `=` are required, and each says the values it takes",
        "(`ir.attr_kinds`; others are refused). Generated; regenerate with",
        "",
        "    python -c \"import ir.registry as r; print(r.op_table_markdown(), end='')\" \\",
        "        > docs/ops.md",
        "",
        "| op | operands -> results | attributes | kind | what it does |",
        "|---|---|---|---|---|",
    ]
    for op in all_ops():
        name = f"`{op.name}`" + (f" ({', '.join(op.aliases)})" if op.aliases else "")
        operands = list(op.operands)
        if op.variadic:
            operands[-1] += "..."
        results = ", ".join(op.results) + ("..." if op.extra.get("variadic_results") else "")
        signature = f"({', '.join(operands)}) -> ({results})"
        attrs = ", ".join(
            (a.name if a.default is REQUIRED else f"{a.name}={a.default!r}") + f": {a.kind}"
            for a in op.attributes
        )
        doc = " ".join(op.doc.split()).replace("|", "\\|")
        rows.append(f"| {name} | {signature} | {attrs} | {op.kind.value} | {doc} |")
    return "\n".join(rows) + "\n"
