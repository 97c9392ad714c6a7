"""Every ``vla ...`` command in a code block of README.md, docs/*.md and results/*/README.md parses against the real
command line, without running anything; the docs' relative links lead somewhere; every results folder whose files
are untraced has a README that says so.

* argparse sub-commands: ``vla.cli.build_parser(argv).parse_known_args(argv)`` must not exit and must leave nothing
  unrecognised; abbreviated flags are refused too (``--num-beam`` for ``--num-beams``), so a doc spells every flag out.
* ``vla train`` (draccus): ``vla.config.load_config(args=...)``, which reads the ``--config_path`` file (it must
  exist) but not the dataset; ``--policy.path DIR`` (fine-tuning, which reads DIR's config.json) is left out and the
  rest checked.
* A usage synopsis (a line with ``[--flag]``, ``a|b`` or ``...``) cannot be parsed as it stands: every ``--flag`` it
  names must be an option of its sub-command instead (``vla train`` synopses are not checked).

Commands are read from fenced blocks and indented blocks; ``\\`` continues a line, ``#`` starts a comment, and a
line may set environment variables first (``OMP_NUM_THREADS=1 vla ...``) or run ``-m vla.cli`` (``accelerate launch
... -m vla.cli train ...``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(RESULTS.rglob("README.md"))]
FENCE = re.compile(r"^\s*(```|~~~)")
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
FLAG = re.compile(r"--[A-Za-z0-9][A-Za-z0-9_.-]*")
HELP = {"-h", "--help"}


@dataclass(frozen=True)
class Command:
    page: str
    line: int  # 1-based line of the command's first physical line
    text: str  # the logical line, continuations joined, comment removed

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.text}"


# --- reading commands out of Markdown ----------------------------------------------------------------------------
def code_lines(markdown: str) -> list[tuple[int, str]]:
    """(line number, text) of every line inside a fenced block or an indented block (4 spaces or a tab, after a
    blank line), in order; blank lines inside blocks are kept as block separators."""
    out: list[tuple[int, str]] = []
    fenced = False
    indented = False
    previous_blank = True
    for number, line in enumerate(markdown.splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
            out.append((number, ""))  # a fence ends any continuation
            previous_blank = False
            continue
        blank = not line.strip()
        if fenced:
            out.append((number, line))
        elif blank:
            if indented:
                out.append((number, ""))
        elif line.startswith(("    ", "\t")) and (previous_blank or indented):
            indented = True
            out.append((number, line))
        else:
            indented = False
        previous_blank = blank
    return out


def strip_comment(line: str) -> str:
    """``line`` up to an unquoted ``#`` that starts a word, as the shell reads it."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def logical_lines(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Join lines ending in a backslash with the next one; comments are removed first (a comment after ``\\`` would
    not continue in the shell either)."""
    out: list[tuple[int, str]] = []
    start, parts = None, []
    for number, raw in lines:
        text = strip_comment(raw).rstrip()
        if start is None:
            start = number
        if text.endswith("\\"):
            parts.append(text[:-1])
            continue
        parts.append(text)
        joined = " ".join(p.strip() for p in parts).strip()
        if joined:
            out.append((start, joined))
        start, parts = None, []
    if parts and " ".join(parts).strip():
        out.append((start, " ".join(p.strip() for p in parts).strip()))
    return out


VLA_LINE = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*(?:\S*/)?vla\s|\s-m\s+vla\.cli(?:\s|$)")


def vla_argv(text: str) -> list[str] | None:
    """The arguments after ``vla`` (or ``-m vla.cli``) in one shell command, or None when it runs something else.
    A ``vla`` line the shell could not split (an unbalanced quote) raises ``ValueError``."""
    if not VLA_LINE.search(text + " "):
        return None
    tokens = shlex.split(text)
    while tokens and ENV_ASSIGNMENT.match(tokens[0]):
        tokens = tokens[1:]
    if not tokens:
        return None
    if tokens[0] == "vla" or tokens[0].endswith("/vla"):
        return tokens[1:]
    for i in range(len(tokens) - 1):
        if tokens[i] == "-m" and tokens[i + 1] == "vla.cli":
            return tokens[i + 2 :]
    return None


def commands_in(text: str, page: str) -> list[Command]:
    out = []
    for number, line in logical_lines(code_lines(text)):
        for segment in re.split(r"\s(?:&&|\|\||;)\s", line):  # `cd x && vla ...`
            if VLA_LINE.search(segment.strip() + " "):
                out.append(Command(page, number, segment.strip()))
    return out


def all_commands() -> list[Command]:
    out = []
    for path in PAGES:
        out.extend(commands_in(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT))))
    return out


# --- checking one command against the real parsers --------------------------------------------------------------
def is_synopsis(text: str) -> bool:
    """A usage line: an optional part (``[--sweep]``), alternatives (``fast|bin``) or an ellipsis. A value such as
    ``--policy.image_keys=[observation.images.top]`` (a draccus list) does not make a synopsis."""
    try:
        tokens = shlex.split(text)
    except ValueError:
        return False
    return any(t.startswith("[") or "|" in t or "..." in t for t in tokens)


def _no_abbreviations(parser: argparse.ArgumentParser) -> None:
    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _no_abbreviations(sub)


def _parser_of(argv: list[str]) -> tuple[argparse.ArgumentParser, list[str]]:
    """The deepest sub-parser ``argv``'s leading words name, and those words."""
    from vla.cli import build_parser

    parser = build_parser(argv)
    path = []
    for word in (a for a in argv if not a.startswith("-")):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or word not in subs[0].choices:
            break
        parser = subs[0].choices[word]
        path.append(word)
    return parser, path


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {s for action in parser._actions for s in action.option_strings}


def problem(text: str) -> str | None:
    """Why the ``vla`` command line ``text`` would not parse, or None when it does."""
    try:
        argv = vla_argv(text)
    except ValueError as err:  # shlex: an unbalanced quote
        return f"the shell cannot split it: {err}"
    if argv is None:
        return "not a vla command"
    words = [a for a in argv if a != "--debug"]
    if not words:
        return "no sub-command"
    from vla.cli import COMMANDS

    if words[0] not in COMMANDS:
        return f"no sub-command {words[0]!r} (vla has {', '.join(COMMANDS)})"
    if words[0] == "train":
        if is_synopsis(text) or HELP & set(words):
            return None
        return _train_problem(words[1:])
    parser, path = _parser_of(argv)
    if is_synopsis(text) or HELP & set(words):
        known = _options(parser) | {"--debug"}
        unknown = sorted({f for f in FLAG.findall(text) if f not in known})
        return f"{' '.join(path)} has no option {', '.join(unknown)}" if unknown else None
    from vla.cli import build_parser

    parser = build_parser(argv)
    _no_abbreviations(parser)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            args, extra = parser.parse_known_args(argv)
    except SystemExit:
        return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else "argparse exited"
    if extra:
        return f"unrecognised arguments: {' '.join(extra)}"
    if args.command is None:
        return "no sub-command"
    return None


POLICY_PATH_FLAGS = ("--policy.path", "--policy.pretrained_path")  # fine-tuning from a saved policy (vla.train)


def _without_policy_path(args: list[str]) -> list[str]:
    """``args`` without ``--policy.path DIR`` / ``--policy.path=DIR``: fine-tuning reads that folder's config.json,
    which a doc's example folder does not have; every other flag is still checked against the config's fields."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a.split("=", 1)[0] in POLICY_PATH_FLAGS:
            skip = "=" not in a
        else:
            out.append(a)
    return out


def _train_problem(args: list[str]) -> str | None:
    from vla.config import load_config

    args = _without_policy_path(args)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            load_config(args=args)
    except SystemExit:  # draccus' argparse: unknown or malformed flags
        lines = err.getvalue().strip().splitlines()
        return lines[-1] if lines else "draccus exited"
    except ValueError as error:  # our own check (missing config file, a bad value)
        return str(error)
    return None


# --- tests -------------------------------------------------------------------------------------------------------
COMMANDS = all_commands()


@pytest.fixture(autouse=True)
def _at_the_repository_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # commands name configs/... relative to the repository root


def test_the_pages_hold_commands():
    """The reader finds commands at all (the README's quickstart, dozens in docs/), so an empty parametrisation cannot
    pass."""
    assert sum(c.page == "README.md" for c in COMMANDS) >= 5
    assert len(COMMANDS) >= 40


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: f"{c.page}:{c.line}")
def test_every_documented_command_parses(command):
    assert problem(command.text) is None, f"{command}\n  -> {problem(command.text)}"


def test_the_reader_joins_continuations_and_drops_comments():
    page = (
        "Text.\n\n"
        "```bash\n"
        "# a comment line, then a command over two lines\n"
        "OMP_NUM_THREADS=1 vla eval --policy outputs/train/fast/policy \\\n"
        "    --episodes 5   # five episodes\n"
        "accelerate launch --num_processes 2 -m vla.cli train --config_path configs/debug.yaml\n"
        "make test\n"
        "```\n\n"
        "    vla data info outputs/datasets/metaworld_push-v3\n"
        "prose that mentions vla eval --policy nowhere\n"
    )
    found = [c.text for c in commands_in(page, "page.md")]
    assert found == [
        "OMP_NUM_THREADS=1 vla eval --policy outputs/train/fast/policy --episodes 5",
        "accelerate launch --num_processes 2 -m vla.cli train --config_path configs/debug.yaml",
        "vla data info outputs/datasets/metaworld_push-v3",
    ]
    assert [c.line for c in commands_in(page, "page.md")] == [5, 7, 11]


@pytest.mark.parametrize(
    "line",
    [
        "vla eval --policy outputs/train/fast/policy --episodes 5",
        "vla data record --task mt10 --episodes 2 --root outputs/datasets/x",
        "vla study run configs/studies/push_pixels.yaml --dry-run",
        "vla train --config_path configs/aloha.yaml --tokenizer.type=beast --steps 8000",
        "vla compare --root DATASET --out DIR [--sweep] [--time-horizon T]",
        "vla train --config_path configs/images.yaml '--policy.image_keys=[observation.images.workspace]'",
        "vla train --policy.path outputs/train/fast/policy --dataset_root=DIR --steps=10 --policy.optimizer_lr=3e-4",
    ],
)
def test_the_checker_passes_good_lines(line):
    assert problem(line) is None


@pytest.mark.parametrize(
    "line, message",
    [
        ("vla eval --policy outputs/train/fast/policy --num-beems 4", "--num-beems"),
        ("vla eval --policy outputs/train/fast/policy --num-beam 4", "--num-beam"),  # an abbreviation
        ("vla eval --episodes 5", "--policy"),  # a required option missing
        ("vla evaluate --policy outputs/train/fast/policy", "evaluate"),
        ("vla data recrod --episodes 5", "recrod"),
        ("vla train --config_path configs/fast.yaml --stepz=3", "--stepz"),
        ("vla train --config_path configs/no_such_file.yaml", "no_such_file"),
        ("vla train --config_path configs/fast.yaml --policy.num_beam=2", "num_beam"),
        ("vla compare --root DATASET --out DIR [--sweeep]", "--sweeep"),  # a synopsis with a misspelled flag
        ("vla train --config_path configs/images.yaml '--policy.image_key=[observation.images.top]'", "image_key"),
        ("vla train --policy.path=outputs/train/fast/policy --policy.optimiser_lr=3e-4", "optimiser_lr"),
    ],
)
def test_the_checker_fails_a_misspelled_line(line, message):
    why = problem(line)
    assert why is not None and message in why, why


# --- links, and what the results READMEs say --------------------------------------------------------------------
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(line.lstrip("#")) for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("#")}


DOC_PAGES = [p for p in PAGES if p != ROOT / "README.md"]


@pytest.mark.parametrize("page", DOC_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_lead_to_files_and_headings(page):
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z]+:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target} (no {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest})")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no heading #{anchor})")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_slugs_follow_github():
    assert slug("Fit one tokenizer: `vla tokenizer fit`") == "fit-one-tokenizer-vla-tokenizer-fit"
    assert slug("ALOHA sim, two arms at 50 Hz") == "aloha-sim-two-arms-at-50-hz"


def _untraced() -> set[Path]:
    lines = (RESULTS / "UNTRACED.txt").read_text().splitlines()
    return {RESULTS / line.strip() for line in lines if line.strip() and not line.startswith("#")}


def test_every_folder_of_untraced_results_has_a_readme_that_says_so():
    """A study folder (or one above it, below results/) holds a README.md that names results/UNTRACED.txt while any
    file below it is listed there."""
    missing = []
    for folder in sorted({f.parent for f in _untraced()} - {RESULTS}):
        readmes = [d / "README.md" for d in (folder, *folder.parents) if d != RESULTS and d.is_relative_to(RESULTS)]
        if not any(r.is_file() and "UNTRACED.txt" in r.read_text(encoding="utf-8") for r in readmes):
            missing.append(str(folder.relative_to(ROOT)))
    assert not missing, f"no README.md saying its numbers are untraced in: {', '.join(missing)}"


def test_a_readme_that_says_untraced_has_untraced_files():
    """Once a study is re-measured with provenance (its files leave UNTRACED.txt), its README must stop saying so."""
    untraced = _untraced()
    stale = [
        str(r.relative_to(ROOT))
        for r in RESULTS.rglob("README.md")
        if "UNTRACED.txt" in r.read_text(encoding="utf-8") and not any(f.is_relative_to(r.parent) for f in untraced)
    ]
    assert not stale, f"these READMEs call their numbers untraced, but UNTRACED.txt lists none of their files: {stale}"


def test_the_library_example_on_the_tokenizers_page_runs(tmp_path, monkeypatch):
    """The ``python`` block of docs/tokenizers.md runs as written, on smooth synthetic actions."""
    import action_tokenizers as at
    from action_tokenizers.rate import VOCAB_CANDIDATES
    from action_tokenizers.synthetic import smooth_chunks

    text = (ROOT / "docs" / "tokenizers.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "docs/tokenizers.md has no python example"
    chunks = smooth_chunks(200, time_horizon=10, action_dim=7, seed=0) * 3.0  # raw units, normalised by the example
    scope = {"frames": chunks.reshape(-1, 7), "chunks": chunks, "T": 10, "D": 7}
    monkeypatch.chdir(tmp_path)
    exec(compile(blocks[0], "docs/tokenizers.md", "exec"), scope)  # noqa: S102 - our own documentation
    norm = scope["norm"]
    assert scope["out"].actions.shape == (4, 10, 7) and scope["out"].valid.all()
    tok = scope["tok"]  # loaded back from the folder the example saved
    assert (tmp_path / "outputs" / "tokenizers" / "fast").is_dir() and tok.vocab_size in VOCAB_CANDIDATES
    fitted = at.FASTTokenizer.fit(norm.normalize(chunks), scale=10)  # the page's fit: vocab_size "auto" says its choice
    assert fitted.fit_choices["vocab_size"][0] == fitted.vocab_size == tok.vocab_size


# --- the docs agree with each other and with the traced results ----------------------------------------------------
def _links(page: Path) -> set[Path]:
    """Every file a page's relative links lead to."""
    found = set()
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        file = target.partition("#")[0]
        if file and not re.match(r"^[a-z]+:", file):
            found.add((page.parent / file).resolve())
    return found


def test_the_docs_index_lists_every_page_and_every_results_folder():
    index = ROOT / "docs" / "index.md"
    linked = _links(index)
    pages = [p for p in (ROOT / "docs").glob("*.md") if p != index]
    studies = sorted(RESULTS.rglob("README.md"))
    missing = [str(p.relative_to(ROOT)) for p in [*pages, *studies] if p.resolve() not in linked]
    assert len(studies) >= 15 and not missing, f"docs/index.md does not link: {', '.join(missing)}"


def _traced_studies() -> list[Path]:
    """Study folders written by ``vla study``: every run recorded with what produced it (``runs.json``), and a page
    that ``vla study table`` draws (``# Study `name` ``)."""
    return sorted(
        r.parent
        for r in RESULTS.rglob("runs.json")
        if (r.parent / "README.md").is_file() and (r.parent / "README.md").read_text().startswith("# Study")
    )


def _means(study: Path) -> list[float]:
    """The bold success means of a study page's table (``| **94%** |``)."""
    return [float(m) for m in re.findall(r"\|\s*\*\*(\d+(?:\.\d+)?)%\*\*\s*\|", (study / "README.md").read_text())]


def _significant(study: Path) -> list[tuple[str, str, str]]:
    """(better, worse, p) of each gap a study page calls significant."""
    rows = re.findall(
        r"^\|[^|]*\|\s*(\S+)\s*\|\s*(\S+)\s*\|[^|]*\|\s*([0-9.]+)\s*\|\s*yes\s*\|$",
        (study / "README.md").read_text(),
        flags=re.M,
    )
    return [tuple(r) for r in rows]


def test_the_readme_results_table_quotes_the_traced_studies():
    """Each README row marked traced quotes its studies' means (to the half point the pages round to) and the p of
    each significant gap; every traced study has a row, marked traced."""
    rows = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| [")]
    assert rows
    seen, wrong = set(), []
    for row in rows:
        studies = [RESULTS / name for name in re.findall(r"\]\(results/([^)]+)/README\.md\)", row)]
        traced = row.rstrip(" |").endswith("yes")
        for study in studies:
            seen.add(study)
            if study in _traced_studies() and not traced:
                wrong.append(f"{study.name}: traced, but its row says not")
        if not traced or not set(studies) & set(_traced_studies()):
            continue
        means = [m for s in studies for m in _means(s)]
        for quoted in re.findall(r"\*\*(\d+(?:\.\d+)?)%\*\*", row):
            if not any(abs(float(quoted) - m) <= 0.5 for m in means):
                wrong.append(f"{studies[0].name}: the README says {quoted}%, its pages' means are {means}")
        for study in studies:
            for better, worse, p in _significant(study):
                if f"p = {p}" not in row:
                    wrong.append(
                        f"{study.name}: {better} over {worse} is significant (p = {p}); the row does not say so"
                    )
    wrong += [
        f"{s.name}: traced, but the README's results table has no row" for s in _traced_studies() if s not in seen
    ]
    assert len(_traced_studies()) >= 4 and not wrong, "; ".join(wrong)


def test_choosing_a_tokenizer_cites_each_traced_verdict():
    """docs/tokenizers.md's advice links every study with a significant gap and quotes its p, so it cannot say the
    opposite of a traced verdict; and no page calls an ordering a study settled "not established"."""
    text = (ROOT / "docs" / "tokenizers.md").read_text(encoding="utf-8")
    advice = text[text.index("## Choosing a tokenizer") :]
    page = ROOT / "docs" / "tokenizers.md"
    linked = {p for p in _links(page) if p.name == "README.md"}
    missing = []
    for study in _traced_studies():
        for better, worse, p in _significant(study):
            if (study / "README.md").resolve() not in linked or f"p = {p}" not in advice.replace("p =\n   ", "p = "):
                missing.append(f"{study.name} ({better} over {worse}, p = {p})")
    assert not missing, f"docs/tokenizers.md's choosing section does not cite: {', '.join(missing)}"
    settled = [
        str(p.relative_to(ROOT))
        for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
        if re.search(r"ordering is not established|did not reproduce it", p.read_text(encoding="utf-8"))
    ]
    assert not settled, f"these pages call a settled ordering open: {settled}"


def test_the_docs_name_fasts_default_order():
    """README.md and docs/tokenizers.md describe FAST's flatten order as the code's default (and the published one as
    byte_level's)."""
    import action_tokenizers as at
    from action_tokenizers.synthetic import smooth_chunks

    chunks = smooth_chunks(64, time_horizon=8, action_dim=3, seed=0)
    default = at.FASTTokenizer.fit(chunks).order
    published = at.FASTTokenizer.fit(chunks, byte_level=True).order
    assert default != published
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    intro = readme[readme.index("FAST (DCT") :][:200]
    assert f"{default}-major flatten" in intro and f"published\n  {published}-major" in intro, intro
    table = next(
        line for line in (ROOT / "docs" / "tokenizers.md").read_text().splitlines() if line.startswith("| `fast`")
    )
    assert f"{default}-major order" in table and f"{published}-major" not in table.partition("byte_level")[0], table
