"""shardrules: declarative sharding rules for JAX pytrees.

```python
import shardrules as sr

rules = sr.load("sharding/llama.shard")
params = sr.apply(params, rules, mesh)
```
"""

import importlib as _importlib
import typing as _typing

from ._costs._attribute import ArrayCost as ArrayCost
from ._costs._attribute import RuleCost as RuleCost
from ._costs._attribute import Share as Share
from ._costs._cost import Collective as Collective
from ._costs._cost import StepCost as StepCost
from ._costs._estimate import TimeEstimate as TimeEstimate
from ._errors import Diagnostic as Diagnostic
from ._errors import GroupNotFoundError as GroupNotFoundError
from ._errors import IncludeNotFoundError as IncludeNotFoundError
from ._errors import MeshError as MeshError
from ._errors import PlacementError as PlacementError
from ._errors import PlanError as PlanError
from ._errors import PlanFileError as PlanFileError
from ._errors import ProcessMismatchError as ProcessMismatchError
from ._errors import RuleDefinitionError as RuleDefinitionError
from ._errors import RuleSyntaxError as RuleSyntaxError
from ._errors import ShardRulesError as ShardRulesError
from ._errors import ShardRulesWarning as ShardRulesWarning
from ._errors import Span as Span
from ._errors import TargetError as TargetError
from ._errors import TreeError as TreeError
from ._language._format import format_text as format_text
from ._language._load import load as load
from ._language._load import loads as loads
from ._language._rules import Rule as Rule
from ._language._rules import RuleSet as RuleSet
from ._placement._apply import apply as apply
from ._placement._checkpoint import load_checkpoint as load_checkpoint
from ._placement._meeting import agree_on_step as _agree_on_step
from ._placement._orbax import load_orbax as load_orbax
from ._placement._reshard import reshard as reshard
from ._placement._sharded_init import init as init
from ._placement._transfer import MovedLeaf as MovedLeaf
from ._placement._transfer import Transfer as Transfer
from ._placement._transfer import transfer as transfer
from ._planning._api import check as check
from ._planning._api import plan as plan
from ._planning._inputs import check_devices as check_devices
from ._planning._layouts import shardings as shardings
from ._planning._layouts import specs as specs
from ._planning._loadcost import HostLoad as HostLoad
from ._planning._loadcost import LoadCost as LoadCost
from ._planning._plan import LeafPlan as LeafPlan
from ._planning._plan import Plan as Plan
from ._planning._shapes import load_shapes as load_shapes
from ._tracing._compare import Comparison as Comparison
from ._tracing._compare import LeafDifference as LeafDifference
from ._tracing._constrain import auto_constrain as auto_constrain
from ._tracing._constrain import constrain as constrain
from ._tracing._jit import jit as jit
from ._tracing._jit import set_agreement as _set_agreement
from ._tracing._shard_map import shard_map as shard_map
from ._version import __version__ as __version__

# Names only some programs use (converters of other projects' rules, `suggest`,
# golden plans): their modules are imported when a name is first read
# (`sr.suggest`, `from shardrules import suggest`), not with shardrules. The
# same names for type checkers and IDEs; tests/test_architecture.py checks that
# this block and `_LAZY` list the same names from the same modules.
if _typing.TYPE_CHECKING:
    from ._convert._common import Conversion as Conversion
    from ._convert._easydel import convert_easydel as convert_easydel
    from ._convert._flax import convert_flax as convert_flax
    from ._convert._hf import convert_hf as convert_hf
    from ._convert._maxtext import convert_maxtext as convert_maxtext
    from ._convert._regex import convert_regex as convert_regex
    from ._reports._golden import assert_plan_matches as assert_plan_matches
    from ._suggest._suggest import suggest as suggest

_LAZY: dict[str, str] = {
    "Conversion": "._convert._common",
    "convert_easydel": "._convert._easydel",
    "convert_flax": "._convert._flax",
    "convert_hf": "._convert._hf",
    "convert_maxtext": "._convert._maxtext",
    "convert_regex": "._convert._regex",
    "assert_plan_matches": "._reports._golden",
    "suggest": "._suggest._suggest",
}
"""Public name → the module defining it, for the names imported on first use."""

__all__ = [
    "ArrayCost",
    "Collective",
    "Comparison",
    "Conversion",
    "Diagnostic",
    "GroupNotFoundError",
    "HostLoad",
    "IncludeNotFoundError",
    "LeafDifference",
    "LeafPlan",
    "LoadCost",
    "MeshError",
    "MovedLeaf",
    "PlacementError",
    "Plan",
    "PlanError",
    "PlanFileError",
    "ProcessMismatchError",
    "Rule",
    "RuleCost",
    "RuleDefinitionError",
    "RuleSet",
    "RuleSyntaxError",
    "ShardRulesError",
    "ShardRulesWarning",
    "Share",
    "Span",
    "StepCost",
    "TargetError",
    "TimeEstimate",
    "Transfer",
    "TreeError",
    "apply",
    "assert_plan_matches",
    "auto_constrain",
    "check",
    "check_devices",
    "constrain",
    "convert_easydel",
    "convert_flax",
    "convert_hf",
    "convert_maxtext",
    "convert_regex",
    "format_text",
    "init",
    "jit",
    "load",
    "load_checkpoint",
    "load_orbax",
    "load_shapes",
    "loads",
    "plan",
    "reshard",
    "shard_map",
    "shardings",
    "specs",
    "suggest",
    "transfer",
]

# Before a step first runs in a multi-process run, `sr.jit` has the processes
# compare their plans and meshes: placement's meeting, handed to tracing here
# (tracing does not import placement).
_set_agreement(_agree_on_step)


if not _typing.TYPE_CHECKING:  # type checkers see the imports above, and flag names that are not there

    def __getattr__(name: str) -> object:
        """A name of `_LAZY`, imported from its module on first use and kept."""
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(_importlib.import_module(module, __name__), name)
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
