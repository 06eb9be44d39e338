"""What `step.cost`, `step.compare` and the command line's `--step` trace do
not repeat is never made, rather than filtered: no warning filter of the
process changes (`warnings.catch_warnings` is not thread-safe), so warnings
of other threads, and every later warning, are still shown."""

from __future__ import annotations

import sys
import threading
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType

import shardrules as sr
from shardrules._cli._step import trace

# `"^nowhere$"` matches no scope output: SR211 each time the step is traced anew
RULES = sr.loads(
    """mesh data=4, model=2

rules params:
  "w$" -> (_, model)

rules activations:
  "^nowhere$" -> (data, _)

rules inputs:
  "x" -> (data, _)
""",
    name="quiet.shard",
)
UNUSED = sr.loads('rules params:\n  "^a$" -> replicated\n  "^never$" -> replicated\n', name="unused.shard")


def mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)


def arguments() -> tuple[dict, np.ndarray]:
    return {"w": np.ones((16, 8), np.float32)}, np.ones((8, 16), np.float32)


def made_step(
    seen: list | None = None, inside: threading.Event | None = None, go: threading.Event | None = None
):
    """A step recording the process's warning filters each time it is traced
    (`seen`), and, on its first trace, saying so (`inside`) and waiting for `go`."""

    def step(params, x):
        if seen is not None:
            seen.append(list(warnings.filters))
        if inside is not None and not inside.is_set():
            inside.set()
            assert go is not None and go.wait(120), "the other thread never warned"
        return jnp.tanh(x @ params["w"])

    return sr.jit(step, RULES, mesh(), in_groups=("params", "inputs"))


def test_cost_and_compare_leave_the_warning_filters_as_they_are_and_say_nothing() -> None:
    seen: list = []
    step = made_step(seen)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        before = list(warnings.filters)
        cost = step.cost(*arguments())
        assert step.compare(*arguments()).ok
        assert list(warnings.filters) == before
    assert cost.devices == 8 and len(seen) >= 3  # traced for the mesh, one device, and compared
    assert all(filters == before for filters in seen)  # no filter installed while tracing
    assert not [w for w in caught if issubclass(w.category, sr.ShardRulesWarning)]


def test_a_quiet_cost_in_one_thread_does_not_silence_another_threads_warnings() -> None:
    inside, go = threading.Event(), threading.Event()
    step = made_step(inside=inside, go=go)
    errors: list[BaseException] = []

    def costing() -> None:
        try:
            step.cost(*arguments())  # its first trace is inside `cost`: it waits there for `go`
        except BaseException as err:  # reported below
            errors.append(err)
            inside.set()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        worker = threading.Thread(target=costing)
        worker.start()
        assert inside.wait(120)
        sr.apply({"a": np.ones(4)}, UNUSED, mesh())  # SR201, made while the other thread is quiet
        go.set()
        worker.join(120)
    assert not errors, errors
    codes = [w.message.code for w in caught if isinstance(w.message, sr.ShardRulesWarning)]
    assert codes == ["SR201"]  # this thread's warning, none of the quiet trace's SR211


def test_many_threads_costing_at_once_leave_later_warnings_shown() -> None:
    before = list(warnings.filters)
    start = threading.Barrier(8)
    errors: list[BaseException] = []

    def costing() -> None:
        try:
            step = made_step()
            start.wait(120)
            for _ in range(2):
                step.cost(*arguments(), ideal=False)
        except BaseException as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=costing) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert list(warnings.filters) == before
    with pytest.warns(sr.ShardRulesWarning, match="SR201"):
        sr.apply({"a": np.ones(4)}, UNUSED, mesh())
    with pytest.warns(sr.ShardRulesWarning, match="SR211"):
        made_step()(*arguments())


def test_the_command_lines_step_trace_changes_no_warning_filter(tmp_path, monkeypatch) -> None:
    (tmp_path / "filters_step.py").write_text(
        "import warnings\n"
        "import jax.numpy as jnp\n"
        "import shardrules as sr\n"
        "SEEN = []\n"
        "def step(params, x):\n"
        "    SEEN.append(list(warnings.filters))\n"
        "    return jnp.tanh(x @ params['w'])\n"
        "def check_step(rules, mesh):\n"
        "    S = jax.ShapeDtypeStruct\n"
        "    args = ({'w': S((16, 8), jnp.float32)}, S((8, 16), jnp.float32))\n"
        "    return sr.jit(step, rules, mesh, in_groups=('params', 'inputs')), args\n"
        "import jax\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        before = list(warnings.filters)
        _, _, traced = trace("filters_step:check_step", RULES, {"data": 4, "model": 2})
        assert list(warnings.filters) == before
    seen = sys.modules["filters_step"].SEEN  # the module the trace imported
    assert seen and all(filters == before for filters in seen)
    assert [d.code for d in traced.unmatched] == ["SR211"]  # comes back as a finding, not a warning
    assert not [w for w in caught if issubclass(w.category, sr.ShardRulesWarning)]


def test_rule_files_loaded_in_many_threads_change_no_filter_and_drop_no_warning() -> None:
    """Patterns are checked for the classes Python warns about (`[[`, `--`, ...)
    without catching its warning: threads loading rule files at once leave the
    filters as they were, and a warning that another thread makes meanwhile
    (a `FutureWarning` too) is shown, not raised or dropped."""
    loaders, rounds, made = 6, 30, 400
    start = threading.Barrier(loaders + 1)
    errors: list[BaseException] = []

    def loading(n: int) -> None:
        try:
            start.wait(120)
            for i in range(rounds):
                text = f'rules params:\n  "w{n}_{i}/[a-z]+$" -> replicated\n' + "".join(
                    f'  "b{j}/(q|k)_[0-9]+/kernel$" -> replicated\n' for j in range(20)
                )
                assert len(sr.loads(text).group("params")) == 21
                with pytest.raises(sr.RuleSyntaxError, match="SR017") as info:
                    sr.loads(f'rules params:\n  "w{n}_{i}[a--z]" -> replicated\n')
                assert "possible set difference at position" in str(info.value)
        except BaseException as err:  # reported below
            errors.append(err)

    def warning() -> None:
        try:
            start.wait(120)
            for i in range(made):
                warnings.warn(f"other {i}", FutureWarning if i % 2 else UserWarning, stacklevel=1)
        except BaseException as err:  # a FutureWarning made an error by another thread's filter
            errors.append(err)

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads take turns often: the races are met, not hoped for
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            before = list(warnings.filters)
            threads = [threading.Thread(target=loading, args=(n,)) for n in range(loaders)]
            threads.append(threading.Thread(target=warning))
            for t in threads:
                t.start()
            for t in threads:
                t.join(300)
            assert list(warnings.filters) == before
    finally:
        sys.setswitchinterval(switch)
    assert not errors, errors
    other = [str(w.message) for w in caught if str(w.message).startswith("other ")]
    assert other == [f"other {i}" for i in range(made)]
    assert not [w for w in caught if not str(w.message).startswith("other ")]  # Python's parser warned none
