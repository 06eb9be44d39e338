"""The examples in docs/diagnostics.md, docs/cli.md and docs/api.md run and give
the output the docs show.

How a page is read: its fenced blocks are taken in order.

- ```shard and ```json blocks are written to a file in the example's folder (a
  fresh temporary folder, the current directory). The file is named by the
  block's first line if that is a comment `# NAME.shard` (the comment stays in
  the file, as its line 1), else by "saved as `NAME`" in the paragraph just
  above, else by the page's default (diagnostics.md: `model.shard` and
  `shapes.json`, as its introduction says). Every json block must be a shapes
  file that `sr.load_shapes` reads.
- ```toml blocks named by "saved as `NAME`" (a `pyproject.toml` with settings)
  and ```yaml blocks named so or by a first line `# NAME.yml` (a MaxText
  config to convert) are written the same way; others are illustrations and
  are not read. On convert.md (`Page.json_shapes` false) json blocks are
  written as they are, not read as shapes files (a transformers plan).
- ```console blocks: each `$ shardrules ARGS` runs in-process
  (`shardrules._cli._main.main`), stdout and stderr together; `$ echo $?` prints the
  status of the command before it. The lines under a command are its output.
  A block of commands alone has its output shown by the ```text block after it.
- A ```python block whose first line is a comment `# NAME.py` is a module that
  a command imports: it is written to that file, not run.
- Other ```python blocks run in the page's namespace (one per `##` section on
  diagnostics.md, starting with `sr`, `jax`, `jnp`, `S`, `f32`, `NamedSharding`
  and `P`, as its introduction says; one for the whole page on the others).
  What a block prints, followed by the rendering of a `ShardRulesError` it
  raises, is its output. A block that is one line `sr.NAME(PARAMS) -> TYPE` is a
  signature: it must list the parameters of `shardrules.NAME` (names, kinds and
  defaults; the types are not compared).
- Value comments: a comment after a bare expression statement in a python block
  (on its last line, or else on the comment lines right below it, joined with
  spaces) must equal `repr` of the expression's value exactly; if evaluating it
  raises, the comment must read `ErrorClass: first line of the message`.
- ```text blocks show the output of the block before them. On diagnostics.md
  and api.md every text block is an output; on diagnostics.md a text block after
  ```shard blocks shows the error that `sr.load("model.shard")` raises. On
  cli.md a text block after nothing that ran is a synopsis and is not read.
- An output that no text block shows must be empty.

Outputs are compared line by line without trailing whitespace (the docs cannot
show it), with the example's folder written as `/home/me/llama`, the folder of
the SR006 example.

Two markers, HTML comments that the rendered page does not show:

- `<!-- not-tested: REASON -->` on the line before a block skips that block and
  the text block showing its output. Keep these for what cannot run here.
- `<!-- test:` ... `-->` (each on its own line) holds blocks that run as if they
  were visible: the files and calls behind an output that the page only
  describes in words ("Other forms", "with a deleted array").

Each page must give at least `Page.min_checks` checks (a compared output, a
value comment or a signature), so that a parsing mistake cannot pass by
checking nothing.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import difflib
import inspect
import io
import re
import shlex
import tokenize
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec

import shardrules as sr
from shardrules._cli._main import main as cli_main

DOCS = Path(__file__).resolve().parent.parent / "docs"
SHOWN_FOLDER = "/home/me/llama"

# Examples that show what the library should do and does not: library bugs, not
# stale pages. While one still fails, its page's test is an expected failure
# (once everything else on the page passes); once it passes, remove it here.
KNOWN_FAILURES: dict[tuple[str, str], str] = {
    # ("api.md", "value of `EXPRESSION`"): "what the library gets wrong",
}


@dataclasses.dataclass(frozen=True)
class Page:
    name: str
    min_checks: int
    default_files: dict[str, str] = dataclasses.field(default_factory=dict)  # lang → file name
    text_is_output: bool = True  # every ```text block shows an output
    fresh_sections: bool = False  # each `##` section in its own folder and namespace
    prelude: dict[str, Any] = dataclasses.field(default_factory=dict)
    json_shapes: bool = True  # every json block is a shapes file


PAGES = {
    "diagnostics.md": Page(
        "diagnostics.md",
        min_checks=58,
        default_files={"shard": "model.shard", "json": "shapes.json"},
        fresh_sections=True,
        prelude={
            "sr": sr,
            "jax": jax,
            "jnp": jnp,
            "S": jax.ShapeDtypeStruct,
            "f32": jnp.float32,
            "NamedSharding": NamedSharding,
            "P": PartitionSpec,
        },
    ),
    "cli.md": Page("cli.md", min_checks=17, text_is_output=False),
    "api.md": Page("api.md", min_checks=42),
    "explicit-axes.md": Page("explicit-axes.md", min_checks=2),
    "convert.md": Page("convert.md", min_checks=17, text_is_output=False, json_shapes=False),
}


# ---------------------------------------------------------------- reading a page


@dataclasses.dataclass(frozen=True)
class Block:
    lang: str  # the fence's info string: shard, json, console, python, text, ...
    text: str  # the content, without the fence's indentation
    line: int  # the line of the opening fence, 1-based
    hidden: bool  # inside a `<!-- test:` comment
    skip: str | None  # the reason of a `<!-- not-tested: ... -->` just above
    paragraph: str  # the paragraph just above, or ""


@dataclasses.dataclass
class Section:
    heading: str
    blocks: list[Block]


FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)\s*$")
NOT_TESTED = re.compile(r"^\s*<!-- not-tested: (?P<reason>.+?) -->\s*$")


def read_page(name: str) -> list[Section]:
    """The page's `##` sections and their fenced blocks (hidden ones included)."""
    lines = (DOCS / name).read_text(encoding="utf-8").split("\n")
    sections = [Section("", [])]
    hidden, skip, paragraph, last_paragraph = False, None, [], ""
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = FENCE.match(line)
        if fence:
            indent = len(fence["indent"])
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            body = [
                text[indent:] if text.startswith(" " * indent) else text.lstrip(" ")
                for text in lines[i + 1 : end]
            ]
            above = " ".join(paragraph) if paragraph else last_paragraph
            sections[-1].blocks.append(
                Block(fence["lang"], "\n".join(body) + "\n", i + 1, hidden, skip, above)
            )
            skip, paragraph, last_paragraph = None, [], ""
            i = end + 1
            continue
        if line.startswith("## "):
            sections.append(Section(line[3:].strip(), []))
        if marker := NOT_TESTED.match(line):
            skip = marker["reason"]
        elif line.strip() == "<!-- test:":
            hidden = True
        elif hidden and line.strip() == "-->":
            hidden = False
        elif line.strip():
            paragraph.append(line.strip())
        elif paragraph:
            last_paragraph, paragraph = " ".join(paragraph), []
        i += 1
    assert not hidden, f"docs/{name}: a `<!-- test:` comment is not closed"
    return sections


# ---------------------------------------------------------------- running a page


@dataclasses.dataclass(frozen=True)
class Check:
    where: str  # docs/PAGE:LINE of what the docs show
    what: str
    expected: str
    actual: str

    @property
    def ok(self) -> bool:
        return self.expected == self.actual

    def report(self) -> str:
        diff = difflib.unified_diff(
            self.expected.splitlines(), self.actual.splitlines(), "docs", "actual", lineterm=""
        )
        return f"{self.where}: {self.what} differs\n" + "\n".join(diff)


@dataclasses.dataclass
class Output:
    """An output waiting for the ```text block that shows it."""

    where: str  # the block that produced it
    what: str
    text: str | Callable[[], str]  # a callable: computed only if a text block asks


def _clean(text: str, folder: Path) -> str:
    """Lines without trailing whitespace, the example's folder as SHOWN_FOLDER."""
    for path in {str(folder), str(folder.resolve())}:
        text = text.replace(path, SHOWN_FOLDER)
    return "\n".join(line.rstrip() for line in text.rstrip("\n").split("\n")).strip("\n")


class PageRun:
    """Runs the blocks of one page in order and collects the checks."""

    def __init__(self, page: Page, monkeypatch: pytest.MonkeyPatch):
        self.page = page
        self.monkeypatch = monkeypatch
        self.checks: list[Check] = []
        self.problems: list[str] = []  # blocks that could not be read as an example
        self.skipped: list[str] = []
        self.folder = Path()
        self.namespace: dict[str, Any] = {}
        self.pending: Output | None = None
        self.status = 0

    def where(self, block: Block, offset: int = 0) -> str:
        return f"docs/{self.page.name}:{block.line + offset}"

    def start(self, folder: Path) -> None:
        """A fresh folder (made the current directory) and namespace."""
        folder.mkdir(parents=True)
        self.monkeypatch.chdir(folder)
        self.folder = folder
        self.namespace = dict(self.page.prelude)

    def compare(self, where: str, what: str, expected: str, actual: str) -> None:
        self.checks.append(Check(where, what, _clean(expected, self.folder), _clean(actual, self.folder)))

    def run(self, blocks: list[Block]) -> None:
        skip_output = False
        for block in blocks:
            if block.skip or (skip_output and block.lang == "text"):
                self.skipped.append(f"{self.where(block)}: {block.skip or 'output of a skipped block'}")
                skip_output = block.lang in ("console", "python")
                continue
            skip_output = False
            if block.lang == "text":
                self.text(block)
                continue
            self.flush()
            handler = getattr(self, f"block_{block.lang}", None)
            if handler is not None:
                handler(block)
        self.flush()

    def flush(self) -> None:
        """An output that no text block shows must be empty."""
        if self.pending is not None and not callable(self.pending.text):
            self.compare(
                self.pending.where, f"{self.pending.what} (shown by no text block)", "", self.pending.text
            )
        self.pending = None

    def text(self, block: Block) -> None:
        pending, self.pending = self.pending, None
        if pending is None:
            if self.page.text_is_output:
                self.problems.append(
                    f"{self.where(block)}: this text block shows the output of nothing; put the example "
                    "behind it in a `<!-- test:` comment above it, or mark it `<!-- not-tested: REASON -->`"
                )
            return
        actual = pending.text() if callable(pending.text) else pending.text
        self.compare(self.where(block), pending.what, block.text, actual)

    # -- files

    def file_name(self, block: Block) -> str | None:
        first = block.text.split("\n", 1)[0]
        if block.lang == "shard" and (named := re.fullmatch(r"# (\S+\.shard)", first.strip())):
            return named[1]
        if block.lang == "python" and (named := re.fullmatch(r"# (\S+\.py)", first.strip())):
            return named[1]
        if block.lang == "yaml" and (named := re.fullmatch(r"# (\S+\.ya?ml)", first.strip())):
            return named[1]
        if saved := re.findall(r"saved as `([^`]+)`", block.paragraph):
            return saved[-1]
        return self.page.default_files.get(block.lang)

    def write(self, block: Block) -> Path | None:
        name = self.file_name(block)
        if name is None:
            return None
        path = self.folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(block.text, encoding="utf-8")
        return path

    def block_shard(self, block: Block) -> None:
        path = self.write(block)
        assert path is not None, f"{self.where(block)}: cannot tell the file name of this rule file"
        if "shard" in self.page.default_files:
            top = self.page.default_files["shard"]
            self.pending = Output(self.where(block), f"sr.load({top!r})", lambda: self.load_error(top))

    def load_error(self, name: str) -> str:
        try:
            sr.load(name)
        except sr.ShardRulesError as err:
            return str(err)
        return f"(sr.load({name!r}) raised nothing)"

    def block_toml(self, block: Block) -> None:
        self.write(block)

    def block_yaml(self, block: Block) -> None:
        self.write(block)

    def block_json(self, block: Block) -> None:
        path = self.write(block)
        if not self.page.json_shapes:
            return
        if path is None:  # an illustration of the format: still a shapes file
            path = self.folder / "example.json"
            path.write_text(block.text, encoding="utf-8")
        sr.load_shapes(path)  # raises if the docs show a malformed shapes file

    # -- commands

    def block_console(self, block: Block) -> None:
        commands: list[tuple[int, str, list[str]]] = []  # (line offset, command, output lines)
        for offset, line in enumerate(block.text.rstrip("\n").split("\n"), start=1):
            if line.startswith("$ "):
                commands.append((offset, line[2:], []))
            else:
                assert commands, f"{self.where(block, offset)}: output before any `$ ` command"
                commands[-1][2].append(line)
        inline = any(output for _, _, output in commands)
        shown = []
        for offset, command, output in commands:
            actual = self.command(command, self.where(block, offset))
            if inline:
                self.compare(
                    self.where(block, offset + 1), f"output of `{command}`", "\n".join(output), actual
                )
            shown.append(actual)
        if not inline:
            self.pending = Output(self.where(block), "output of the commands", "".join(shown))

    def command(self, command: str, where: str) -> str:
        argv = shlex.split(command, comments=True)
        if argv == ["echo", "$?"]:
            return f"{self.status}\n"
        if argv[0] != "shardrules":
            self.problems.append(f"{where}: only `shardrules` and `echo $?` run here; mark others not-tested")
            return ""
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                self.status = cli_main(argv[1:])
            except SystemExit as exit_:  # argparse: --help, --version, usage errors
                self.status = exit_.code if isinstance(exit_.code, int) else 1
        return out.getvalue()

    # -- Python

    def block_python(self, block: Block) -> None:
        if re.fullmatch(r"# (\S+\.py)", block.text.split("\n", 1)[0].strip()):
            self.write(block)  # a module a command imports (`--step MODULE:FUNCTION`)
            return
        if SIGNATURE.fullmatch(block.text.strip()):
            self.signature(block)
            return
        tree = ast.parse(block.text)
        values = ValueComments(block.text)
        tree = ast.fix_missing_locations(values.visit(tree))
        ast.increment_lineno(tree, block.line)
        code = compile(tree, str(DOCS / self.page.name), "exec")
        self.namespace["__doc_value__"] = lambda index, thunk: self.value(
            block, values.expected[index], thunk
        )
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            try:
                exec(code, self.namespace)
            except sr.ShardRulesError as err:
                print(err)
        if out.getvalue():
            self.pending = Output(self.where(block), "output of the python block", out.getvalue())

    def value(self, block: Block, expected: tuple[int, str, str], thunk: Callable[[], Any]) -> None:
        line, expression, comment = expected
        try:
            actual = repr(thunk())
        except Exception as err:
            actual = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        self.compare(self.where(block, line), f"value of `{expression}`", comment, actual)

    def signature(self, block: Block) -> None:
        match = SIGNATURE.fullmatch(block.text.strip())
        assert match is not None
        namespace: dict[str, Any] = {}
        exec(f"def documented{match['params']}: pass", namespace)
        real = inspect.signature(getattr(sr, match["name"]))
        real = real.replace(
            parameters=[p.replace(annotation=inspect.Parameter.empty) for p in real.parameters.values()],
            return_annotation=inspect.Signature.empty,
        )
        documented = str(inspect.signature(namespace["documented"]))
        self.compare(self.where(block, 1), f"signature of sr.{match['name']}", documented, str(real))


SIGNATURE = re.compile(r"sr\.(?P<name>\w+)(?P<params>\(.*\)) -> .+")


class ValueComments(ast.NodeTransformer):
    """Turns each bare expression with a value comment into
    `__doc_value__(INDEX, lambda: EXPRESSION)`, keeping `expected[INDEX]` =
    (line in the block, the comment's text)."""

    def __init__(self, source: str):
        self.lines = source.split("\n")
        tokens = tokenize.generate_tokens(io.StringIO(source).readline)
        self.comments = {t.start[0]: t.string for t in tokens if t.type == tokenize.COMMENT}
        self.source = source
        self.expected: list[tuple[int, str, str]] = []  # (line, expression, comment)

    def comment_after(self, node: ast.expr) -> str | None:
        line = node.end_lineno or node.lineno
        if line in self.comments:
            return self.comments[line].lstrip("#").strip()
        below = []
        while line < len(self.lines) and self.lines[line].strip().startswith("#"):
            below.append(self.lines[line].strip().lstrip("#").strip())
            line += 1
        return " ".join(below) or None

    def visit_Expr(self, node: ast.Expr) -> ast.stmt:
        call = node.value
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "print":
            return node
        comment = self.comment_after(node.value)
        if comment is None:
            return node
        expression = ast.get_source_segment(self.source, node.value) or ast.unparse(node.value)
        self.expected.append((node.lineno, expression, comment))
        thunk = ast.Lambda(
            args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]),
            body=node.value,
        )
        index = ast.Constant(len(self.expected) - 1)
        return ast.copy_location(
            ast.Expr(ast.Call(ast.Name("__doc_value__", ast.Load()), [index, thunk], [])), node
        )


# ---------------------------------------------------------------- the tests


def run_page(page: Page, folder: Path, monkeypatch: pytest.MonkeyPatch) -> PageRun:
    monkeypatch.setenv("COLUMNS", "80")  # argparse wraps --help to the terminal width
    run = PageRun(page, monkeypatch)
    sections = read_page(page.name)
    if page.fresh_sections:
        for number, section in enumerate(sections):
            run.start(folder / f"section{number}")
            run.run(section.blocks)
    else:
        run.start(folder / "page")
        run.run([block for section in sections for block in section.blocks])
    return run


def _blocks(name: str) -> Iterator[Block]:
    for section in read_page(name):
        yield from section.blocks


def test_hidden_and_indented_blocks_are_read() -> None:
    """The parser sees the blocks in `<!-- test:` comments and the fences inside list items."""
    blocks = list(_blocks("diagnostics.md"))
    assert any(b.hidden for b in blocks)
    assert any(b.lang == "text" and b.text.startswith("SR108 apply needs a mesh") for b in blocks)


@pytest.mark.parametrize("name", PAGES)
def test_doc_examples(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    page = PAGES[name]
    run = run_page(page, tmp_path, monkeypatch)
    known = [c for c in run.checks if (name, c.what) in KNOWN_FAILURES]
    failed = run.problems + [c.report() for c in run.checks if not c.ok and c not in known]
    assert not failed, f"{len(failed)} of {len(run.checks)} examples differ:\n\n" + "\n\n".join(failed)
    assert len(run.checks) >= page.min_checks, (
        f"docs/{name}: only {len(run.checks)} checks, expected at least {page.min_checks}"
    )
    missing = {what for page_name, what in KNOWN_FAILURES if page_name == name} - {c.what for c in known}
    assert not missing, f"KNOWN_FAILURES names examples docs/{name} does not have: {missing}"
    fixed = [c.where for c in known if c.ok]
    assert not fixed, f"these examples pass now; remove them from KNOWN_FAILURES: {fixed}"
    if known:
        pytest.xfail("; ".join(f"{c.where}: {KNOWN_FAILURES[name, c.what]}" for c in known))
