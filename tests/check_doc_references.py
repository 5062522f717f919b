#!/usr/bin/env python3
"""Every repository path that a doc or a code comment names must exist.

    python3 tests/check_doc_references.py [REPO_ROOT]      (ctest runs it as doc_references)
    python3 tests/check_doc_references.py --self-test      (doc_references_self_test)

Exit status 0 when every reference resolves, 1 with the list of offenders (file:line, the
reference, why), 2 for bad usage.

Where references are looked for:
  - Markdown files (*.md): the whole text.
  - C, C++ and CUDA sources and headers: // and /* */ comments.
  - Python: # comments and string literals that stand alone as statements (docstrings).
  - Shell, CMake, YAML, TOML: # comments.
Files under build*/ are ignored; those under examples/data/ (the corpus) exist but are not read.

What counts as a reference (and must exist):
  1. "DESIGN.md", anywhere: that file is not part of the repository (docs/architecture.md and
     the guides in docs/ hold the topics it had).
  2. A path whose first component is a top-level folder of the repository
     (engine/src/gemm/pairing.cpp, docs/recipes.md, recipes/*.yaml, tests/gpu/), relative to
     the repository root. `*`, `?` and placeholders in angle brackets (plugins/<format>/)
     match any name; a path that names a folder must be a folder or a file prefix.
  3. In Markdown: the target of a relative link `[text](target)`, relative to the Markdown
     file (an anchor after '#' is not checked).
  4. A bare Markdown file name (`numerics.md`): it must exist beside the referencing file, at
     the root or in docs/.
  5. "STYLE.md", like DESIGN.md: not in the repository (docs/architecture.md, "Conventions").
Not references: URLs, paths under build*/, $VARIABLES, absolute paths, usage lines
("usage: ... > RESULT.md" names placeholders), and file names of other projects cited in
comments (no folder of ours, no .md extension).
"""
from __future__ import annotations

import io
import re
import subprocess
import sys
import tokenize
from fnmatch import fnmatch
from pathlib import Path
from typing import Iterator, List, Optional, Set, Tuple

C_LIKE = {".c", ".cc", ".cpp", ".cxx", ".h", ".hh", ".hpp", ".cu", ".cuh"}
HASH_COMMENTS = {".sh", ".cmake", ".yaml", ".yml", ".toml"}
NOT_READ = ("examples/data/",)  # the corpus: text, not documentation
SKIPPED_PREFIXES = ("build", ".git/")

PATH_CHARS = r"[A-Za-z0-9_.*?<>+\-]"
PATH_RE = re.compile(rf"(?<![A-Za-z0-9_./$<>-])((?:{PATH_CHARS}+/)+{PATH_CHARS}*)")
BARE_MD_RE = re.compile(r"(?<![A-Za-z0-9_./$<>-])([A-Za-z0-9_-]+\.md)\b")
LINK_RE = re.compile(r"\]\(([^)\s]+)\)")
URL_RE = re.compile(r"[a-z][a-z0-9+.-]*://\S+")
USAGE_RE = re.compile(r"\s*usage:", re.IGNORECASE)


def repo_files(root: Path) -> List[str]:
    """Tracked files plus new files git does not ignore; without git, every file."""
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "--cached", "--others",
                              "--exclude-standard"], check=True, capture_output=True,
                             text=True).stdout
        files = [f for f in out.splitlines() if (root / f).is_file()]
    except (OSError, subprocess.CalledProcessError):
        files = [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()]
    return sorted(f for f in files if not f.startswith(SKIPPED_PREFIXES))


# ------------------------------------------------------------------ text the check reads
def c_comments(text: str) -> Iterator[Tuple[int, str]]:
    """(line, text) of every // and /* */ comment, skipping string and char literals."""
    i, line, n = 0, 1, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            yield line, text[i + 2:end]
            i = end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end
            for k, part in enumerate(text[i + 2:end].split("\n")):
                yield line + k, part
            line += text.count("\n", i, end)
            i = end + 2
        elif c in "\"'":
            # A raw string R"(...)" is rare in comments' neighbourhood; plain literals end at
            # the next unescaped quote on the same line.
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            i = j + 1
        else:
            i += 1


def hash_comments(text: str) -> Iterator[Tuple[int, str]]:
    """(line, text) after a '#' that starts a line or follows whitespace."""
    for number, line in enumerate(text.split("\n"), 1):
        m = re.search(r"(^|\s)#(.*)$", line)
        if m:
            yield number, m.group(2)


def python_docs(text: str) -> Iterator[Tuple[int, str]]:
    """(line, text) of # comments and of string literals that are whole statements."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        yield from hash_comments(text)
        return
    previous = tokenize.NEWLINE
    for k, tok in enumerate(tokens):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
        elif tok.type == tokenize.STRING and previous in (tokenize.NEWLINE, tokenize.INDENT,
                                                          tokenize.DEDENT, tokenize.NL):
            nxt = tokens[k + 1].type if k + 1 < len(tokens) else tokenize.ENDMARKER
            if nxt in (tokenize.NEWLINE, tokenize.ENDMARKER):
                for j, part in enumerate(tok.string.split("\n")):
                    yield tok.start[0] + j, part
        if tok.type not in (tokenize.COMMENT,):
            previous = tok.type


def documented_text(path: Path, rel: str) -> Iterator[Tuple[int, str]]:
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return
    suffix = path.suffix.lower()
    if suffix == ".md":
        yield from enumerate(text.split("\n"), 1)
    elif suffix in C_LIKE:
        yield from c_comments(text)
    elif suffix == ".py":
        yield from python_docs(text)
    elif suffix in HASH_COMMENTS or path.name == "CMakeLists.txt" or rel.startswith(".ci/"):
        yield from hash_comments(text)


# ------------------------------------------------------------------ resolution
class Repo:
    def __init__(self, root: Path, files: List[str]):
        self.root = root
        self.files: Set[str] = set(files)
        self.dirs: Set[str] = {str(Path(f).parent) for f in files} - {"."}
        for d in list(self.dirs):
            parts = Path(d).parts
            self.dirs.update(str(Path(*parts[:i])) for i in range(1, len(parts)))
        self.top = {Path(f).parts[0] for f in files if len(Path(f).parts) > 1}

    def exists(self, ref: str) -> bool:
        ref = ref.strip("/")
        if ref in self.files or ref in self.dirs:
            return True
        if re.search(r"[*?<]", ref):
            pattern = re.sub(r"<[^>/]*>", "*", ref)
            return any(fnmatch(f, pattern) or fnmatch(f, pattern + "/*") for f in self.files)
        return False


def clean(ref: str) -> str:
    ref = ref.rstrip(".,;:)`'\"")
    return ref.split("#", 1)[0]


def references(repo: Repo, rel: str, line: str) -> Iterator[Tuple[str, Optional[str]]]:
    """(reference, why it fails or None) for the references on one line of text."""
    line = URL_RE.sub(" ", line)
    if USAGE_RE.match(line):  # a usage line names placeholders (RESULT.md), not files
        return
    if "DESIGN.md" in line or re.search(r"\bDESIGN\b(?!_)", line):
        yield "DESIGN.md", "DESIGN.md is not in the repository: cite docs/architecture.md " \
                           "or the guide in docs/ that holds the topic"
    here = Path(rel).parent
    if rel.endswith(".md"):
        for target in LINK_RE.findall(line):
            target = clean(target)
            if not target or re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
                continue
            resolved = (here / target).as_posix()
            resolved = str(Path(resolved)).replace("\\", "/")
            normal = _normalize(resolved)
            if normal is None or not repo.exists(normal):
                yield target, f"link target {normal or resolved} does not exist"
    for match in PATH_RE.finditer(line):
        ref = clean(match.group(1))
        first = ref.split("/", 1)[0]
        if first not in repo.top or first.startswith("build"):
            continue
        if not repo.exists(ref):
            yield ref, "no such file or folder in the repository"
    for match in BARE_MD_RE.finditer(line):
        name = match.group(1)
        if name == "DESIGN.md":
            continue
        candidates = [(here / name).as_posix(), name, f"docs/{name}"]
        if not any(_normalize(c) and repo.exists(_normalize(c)) for c in candidates):
            yield name, "no such Markdown file beside it, at the root or in docs/"


def _normalize(path: str) -> Optional[str]:
    parts: List[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                return None
            parts.pop()
        else:
            parts.append(part)
    return "/".join(parts)


def check(root: Path) -> List[str]:
    """Every offender as 'file:line: 'reference': why'."""
    return check_files(root, repo_files(root))


def check_files(root: Path, files: List[str]) -> List[str]:
    repo = Repo(root, files)
    problems = []
    me = Path(__file__).resolve()
    for rel in files:
        path = root / rel
        if path.resolve() == me:
            continue
        if rel.startswith(NOT_READ):
            continue
        for number, text in documented_text(path, rel):
            for ref, why in references(repo, rel, text):
                if why:
                    problems.append(f"{rel}:{number}: '{ref}': {why}")
    return problems


def self_test() -> int:
    """Plants good and bad references of every kind in a scratch tree and checks that exactly
    the bad ones are reported."""
    import tempfile
    files = {
        "CMakeLists.txt": "# engine/src/a.cpp exists; engine/src/gone.cpp does not\n",
        "engine/src/a.cpp": ('// See docs/guide.md and DESIGN.md section 4.\n'
                             'const char* s = "docs/not_a_comment.md";  // plugins/<fmt>/x.hpp\n'
                             '/* plugins/gone/ and\n   docs/guide.md */\n'),
        "plugins/fp/x.hpp": "// STYLE.md rule 11; cf. TransformerEngine util/logging.h\n",
        "docs/guide.md": ("[ok](other.md) [bad](nope.md#a) [up](../engine/src/a.cpp) "
                          "https://example.com/docs/x.md\nsee numerics.md and other.md\n"
                          "usage: tool > RESULT.md\n"),
        "docs/other.md": "recipes/*.yaml and recipes/*.json, build/demo/x.png\n",
        "recipes/r.yaml": "# tools/x.sh\nname: docs/ignored.md\n",
        "tools/t.py": ('"""Uses engine/src/a.cpp and engine/src/b.cpp."""\n'
                       'x = "docs/in_a_string.md"  # but examples/ is no folder here\n'),
    }
    expected = {
        "CMakeLists.txt:1: 'engine/src/gone.cpp'",
        "engine/src/a.cpp:1: 'DESIGN.md'",
        "engine/src/a.cpp:3: 'plugins/gone/'",
        "plugins/fp/x.hpp:1: 'STYLE.md'",
        "docs/guide.md:1: 'nope.md'",
        "docs/guide.md:2: 'numerics.md'",
        "docs/other.md:1: 'recipes/*.json'",
        "recipes/r.yaml:1: 'tools/x.sh'",
        "tools/t.py:1: 'engine/src/b.cpp'",
    }
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for rel, text in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text, encoding="utf-8")
        got = {p.split("': ", 1)[0] + "'" for p in check(root)}
    if got != expected:
        print("self-test FAILED\n  missed: " + ", ".join(sorted(expected - got)) +
              "\n  unexpected: " + ", ".join(sorted(got - expected)))
        return 1
    print(f"self-test: ok ({len(expected)} planted offenders found, nothing else)")
    return 0


def main(argv: List[str]) -> int:
    if argv[1:] == ["--self-test"]:
        return self_test()
    if len(argv) > 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    root = Path(argv[1]).resolve() if len(argv) == 2 else Path(__file__).resolve().parent.parent
    if not (root / "CMakeLists.txt").is_file():
        print(f"check_doc_references.py: {root} is not the qrecipe repository root "
              f"(no CMakeLists.txt)", file=sys.stderr)
        return 2
    files = repo_files(root)
    problems = check_files(root, files)
    if problems:
        print(f"{len(problems)} reference(s) to paths that do not exist:")
        for p in problems:
            print(f"  {p}")
        print("Fix the path, or point to the doc that holds the topic (docs/architecture.md "
              "for the design); tests/check_doc_references.py says what counts.")
        return 1
    print(f"doc references: ok ({len(files)} files checked)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
