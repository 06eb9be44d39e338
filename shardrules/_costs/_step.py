"""`RuleJit.cost`: a step compiled for its mesh, or for the chips a target
names, and for one device of it (the ideal), read as a `StepCost`.

With a TPU target the step is traced and compiled again on the topology's
devices (the same axis names, sizes and types), by the TPU compiler: its
FLOPs, memory and collectives are that compiler's. With a GPU target it is
compiled for the mesh it has (simulated CPU devices) and costed with the
chip's figures. Either way the target's chip gives the memory the peak must
fit in and the figures of the time estimate.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from .._quiet import quiet
from .._tracing._compare import on_one_device, one_device_mesh, shapes_only
from .._tracing._constrain import Traced
from ._attribute import Owners
from ._cost import StepCost, cost_of
from ._estimate import estimate
from ._groups import axes_of
from ._hlo import matmul_flops_by_dtype
from ._owners import owners_of
from ._targets import Target, parse_target, target_mesh
from ._unpartitioned import Unpartitioned


def _compile(lowered: Any, tpu: bool) -> Any:
    """`lowered.compile()`; for a TPU, a program over the chip's memory is
    compiled all the same (the TPU compiler refuses one by default, saying
    only by how much), so that its figures say where the memory goes."""
    try:
        return lowered.compile()
    except Exception as err:
        if not (tpu and "RESOURCE_EXHAUSTED" in str(err)):
            raise
        try:
            return lowered.compile(compiler_options={"xla_tpu_no_crash_on_oom": True})
        except Exception as again:
            raise RuntimeError(
                f"the TPU compiler refuses the step: {_first_line(err)}; compiled past the chip's memory "
                f"all the same, it says: {_first_line(again)}"
            ) from None


def _first_line(err: BaseException) -> str:
    return str(err).strip().split("\n", 1)[0]


@dataclasses.dataclass
class _Compiled:
    """A step compiled on a mesh: the program, the lowered program (its text
    before XLA's optimisations has the dtypes the model's own code asks for),
    the one-device program (`None`: not asked for, or not compiled: `notes`
    say why), the arrays' owners, and whether the one-device program was tried."""

    compiled: Any
    lowered: Any
    one_device: Any = None
    notes: tuple[str, ...] = ()
    owners: Owners | None = None
    ideal_tried: bool = False
    # the `StepCost`s read off these programs, by (ideal, target): a cost asked again is not read again
    costs: dict[tuple[bool, str | None], StepCost] = dataclasses.field(default_factory=dict)

    @property
    def before(self) -> str:
        """The program's text before XLA's optimisations (read where a GPU target needs it)."""
        return self.lowered.as_text(dialect="hlo")


def _compiled(step: Any, mesh: Any, args: tuple[Any, ...], ideal: bool, *, own: bool) -> _Compiled:
    """`step` (a `RuleJit`) compiled on `mesh` (`own`: the mesh it runs on)
    for arguments shaped like `args`, and (with `ideal`) on one device of it;
    each compiled once per argument signature and mesh (kept by the step)."""
    shapes = shapes_only(args)
    tpu = mesh.devices.flat[0].platform == "tpu"
    key = (step._key(shapes), mesh)
    out = step._programs.get(key)
    with quiet():  # told once already, when the step was traced for its mesh
        if out is None:
            on_mesh = step if own else step._like(mesh)
            lowered = on_mesh.lower(*shapes)
            out = _Compiled(_compile(lowered, tpu), lowered)
            out.owners = owners_of(on_mesh, shapes, mesh, _traced(on_mesh, shapes, mesh, lowered))
            step._programs[key] = out
        if ideal and not out.ideal_tried:
            one = _cpu_device_mesh(mesh) if tpu else one_device_mesh(mesh)
            try:
                out.one_device = _one_device(step, shapes, one)
            except Exception as err:  # the ideal is a reference: the step's own figures stand without it
                out.one_device, out.notes = _before_partitioning(out.lowered, err)
            out.ideal_tried = True
    if not ideal:
        return dataclasses.replace(out, one_device=None, notes=())
    return out


def _traced(step: Any, shapes: tuple[Any, ...], mesh: Any, lowered: Any) -> Traced:
    """What the owners of `step`'s arrays need of its trace: the one its
    lowering recorded; where the step is its function itself (Auto axes, no
    activation rules: no scope has a rule, no layout is decided), only the
    output's shapes, which the lowered program has."""
    if step._constrains(mesh):
        return step._traced(shapes)
    return Traced(out_shape=lowered.out_info)


def _one_device(step: Any, shapes: tuple[Any, ...], one: Any) -> Any:
    """`step` (a `RuleJit`) compiled for the one device of `one`: `jax.jit`
    of its function, with `one` as JAX's mesh. On one device no layout
    changes the arithmetic, so the rules need not be evaluated (a trace
    fewer than `sr.jit` on that mesh); where plain `jax.jit` refuses the
    step there (a `with_sharding_constraint` on an axis the values do not
    carry, say), it is the step as `sr.jit` makes it on that mesh."""
    import jax

    try:
        lowered = on_one_device(lambda *a: jax.jit(step.fn).lower(*a), shapes, one)
    except Exception:
        lowered = on_one_device(step._like(one).lower, shapes, one)
    return _for_its_figures(lowered)


# Compiling for one CPU device only to read the program's figures: XLA's HLO
# passes (which decide the FLOPs, bytes and memory) run as always; the
# machine code, never run, is generated without LLVM's costly optimisations
# (about a third less compile time; the figures are the same).
_FIGURES_ONLY = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def _for_its_figures(lowered: Any) -> Any:
    """`lowered` compiled for what `cost_of` reads of an ideal (its FLOPs,
    its text), with `_FIGURES_ONLY` where the compiler takes those options."""
    try:
        return lowered.compile(compiler_options=_FIGURES_ONLY)
    except Exception:
        return lowered.compile()


def _before_partitioning(lowered: Any, err: Exception) -> tuple[Any, tuple[str, ...]]:
    """The ideal of a step that does not compile for one device (a model
    holding its own mesh states its layouts on it): the program lowered for
    its mesh, before XLA partitions it (`_unpartitioned`), and a note."""
    why = _first_line(err)
    try:
        counted = Unpartitioned(lowered)
        counted.cost_analysis()  # a backend that cannot count it says so here
    except Exception:
        return None, (
            f"no ideal: the step does not compile for one device ({why}); FLOPs are not set against it",
        )
    return counted, (
        f"the ideal is the step's FLOPs before XLA partitions it, divided among the devices: the step does "
        f"not compile for one device ({why})",
    )


def _cpu_device_mesh(mesh: Any) -> Any:
    """A mesh of `mesh`'s axis names and types, every axis of size 1, on one
    CPU device: a TPU target's ideal. The one-device step's FLOPs are counted
    by XLA's CPU compiler, which never refuses a program for its memory (the
    TPU compiler refuses most steps worth sharding, on one chip) and compiles
    it in a fraction of the time."""
    import jax

    names = tuple(mesh.axis_names)
    device = jax.devices("cpu")[0]
    return jax.make_mesh((1,) * len(names), names, axis_types=tuple(mesh.axis_types), devices=[device])


def _target_mesh(step: Any, args: tuple[Any, ...], chosen: Target) -> tuple[Any, bool]:
    """The mesh `step` is costed on for `chosen`, and whether it is the
    step's own: its mesh laid out on a TPU topology (an `AbstractMesh` will
    do), or the mesh it runs on (a GPU target)."""
    from jax.sharding import Mesh

    if step.mesh is not None and not isinstance(step.mesh, Mesh) and chosen.compiler == "tpu":
        return target_mesh(chosen, step.mesh), False  # sizes and types without devices
    entry = step._entry(args, stacklevel=5)
    mesh = target_mesh(chosen, entry.mesh)
    return mesh, mesh is entry.mesh


def step_cost(
    step: Any, args: tuple[Any, ...], *, ideal: bool = True, target: str | Target | None = None
) -> StepCost:
    """What one call of `step` (a `RuleJit`) with arguments like `args`
    costs each device: compiled for the mesh it runs on, or for `target`
    (a TPU topology or a GPU model), and, with `ideal`, for one device of it.

    **Raises:** `TargetError` (SR126) for a target that cannot be compiled for."""
    chosen = None if target is None else target if isinstance(target, Target) else parse_target(target)
    if chosen is None:
        mesh, own = step._entry(args, stacklevel=4).mesh, True
    else:
        mesh, own = _target_mesh(step, args, chosen)
    made = _compiled(step, mesh, args, ideal, own=own)
    key = (ideal, None if chosen is None else chosen.name)
    if key not in made.costs:
        compiler = "cpu" if chosen is None else chosen.compiler
        cost = cost_of(
            made.compiled, int(mesh.devices.size), made.one_device, compiler=compiler, owners=made.owners
        )
        cost = dataclasses.replace(cost, notes=made.notes)
        made.costs[key] = cost if chosen is None else on_target(cost, chosen, mesh, made)
    return made.costs[key]


def on_target(
    cost: StepCost, target: Target, mesh: Any, made: _Compiled, compiler: str | None = None
) -> StepCost:
    """`cost` with what `target`'s chip says of it: its memory, and the
    estimated step time (the matrix multiplications' dtypes from the
    compiled program on a TPU; on a GPU target, from the program before the
    CPU compiler, which runs bfloat16 arithmetic in float32). `compiler`:
    the one that compiled `made` (default: the target's)."""
    chip = target.chip
    compiler = compiler or target.compiler
    compiled = made.compiled.as_text() or ""
    by_dtype = matmul_flops_by_dtype(compiled) if compiler == "tpu" else products_by_dtype(made.before)
    notes = cost.notes
    if compiler != "tpu" and _narrow(by_dtype):
        notes += (
            "the model computes in bfloat16 (or narrower), and the CPU compiler runs much of that in float32 "
            "(its collectives too): bytes accessed, temporaries and collective bytes can be up to twice a "
            "GPU's, and the estimate's memory and communication parts with them; the compute part is "
            "timed at the chip's bfloat16 rate",
        )
    shape = tuple(mesh.devices.shape)
    axes = [len(axes_of(call.groups, shape)) for call in cost.calls]
    node_of = [d.id // chip.node_size for d in mesh.devices.flat] if chip.node_size else None
    model = cost.ideal_flops_per_device
    return dataclasses.replace(
        cost,
        target=target.name,
        notes=notes,
        hbm_bytes_per_device=chip.hbm_bytes,
        estimate=estimate(
            chip,
            flops=cost.flops_per_device,
            bytes_accessed=cost.bytes_accessed_per_device,
            by_dtype=by_dtype,
            calls=cost.calls,
            devices=cost.devices,
            axes=axes,
            node_of=node_of,
            model_flops=model,
        ),
    )


def _narrow(by_dtype: dict[str, float]) -> bool:
    """Whether most matrix-multiplication FLOPs have operands narrower than float32."""
    narrow = sum(n for d, n in by_dtype.items() if d not in ("f32", "f64"))
    return narrow > sum(by_dtype.values()) / 2


_DEFINED = re.compile(
    r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<shape>[a-z]+[0-9a-z]*\[[0-9,]*\]\S*)\s"
)
_PRODUCT = re.compile(r"\s(?P<op>dot|convolution)\((?P<args>%?(?P<lhs>[\w.\-]+),\s*%?(?P<rhs>[\w.\-]+)\).*)$")


def products_by_dtype(text: str) -> dict[str, float]:
    """The FLOPs of the matrix products of an HLO module as the model's code
    wrote it (`Lowered.as_text(dialect="hlo")`, before XLA's optimisations
    change their types), by their operands' element type, each counted as
    `_flops` counts it; each product once (what matters is each type's share).
    That text names values without `%`, which `_hlo.program` reads."""
    from ._flops import flops
    from ._hlo import Instruction

    shapes: dict[str, str] = {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        defined = _DEFINED.match(line)
        if defined is None:
            continue
        shapes[defined["name"]] = defined["shape"]
        product = _PRODUCT.search(line)
        if product is None or product["lhs"] not in shapes or product["rhs"] not in shapes:
            continue
        lhs, rhs = shapes[product["lhs"]], shapes[product["rhs"]]
        i = Instruction(
            "", defined["name"], defined["shape"], product["op"], product["args"], False, (lhs, rhs)
        )
        dtype = lhs.split("[", 1)[0]
        out[dtype] = out.get(dtype, 0.0) + flops(i)
    return out
