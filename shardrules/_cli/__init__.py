"""The `shardrules` command line: `fmt`, `lint`, `explain`.

The commands (`_main`), the lint job run on a rule file with no devices
(`_lint`), and how findings and plans are printed (`_render`).

May import: every other stage.
"""

from ._main import main as main
