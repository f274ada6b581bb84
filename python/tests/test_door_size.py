"""Issue 30: every door stays small (docs/design.md, "How big a door may be"): at most
``MAX_CODE_LINES`` code lines over the files that make it. A door only translates its
queue's vocabulary; what grows past this is a fact or a runtime that belongs elsewhere.

A code line is a line holding a token that is not a comment: blank lines, comment lines
and (Python) docstrings are not counted, so the doc comment every public name carries
costs nothing. The files are read by each language's own lexer (Python's ``tokenize``
and ``ast``, Ruby's ``Ripper``), not by patterns a string could fool."""

from __future__ import annotations

import ast
import io
import json
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_CODE_LINES = 250

#: Each door and the files that make it (globs under the checkout).
DOORS = {
    "Sidekiq": ["lib/idempotent_job/sidekiq.rb", "lib/idempotent_job/sidekiq/*.rb"],
    "ActiveJob": ["lib/idempotent_job/active_job.rb", "lib/idempotent_job/active_job/*.rb"],
    "Celery": ["python/idempotent_job/celery.py"],
    "SQS": [
        "python/idempotent_job/sqs.py"
    ],  # its runtimes (consumer loop, Lambda, resender): _sqs_runtime.py
}

_NOT_CODE = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENCODING,
    tokenize.ENDMARKER,
}


def python_code_lines(text: str) -> set[int]:
    """The numbers of ``text``'s code lines: lines a token other than a comment touches
    (a string spanning lines touches each of its non-blank lines), less docstrings (a
    string that is the first statement of a module, class or function body)."""
    lines = text.splitlines()
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                docstrings.update(range(first.lineno, first.end_lineno + 1))
    code: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type in _NOT_CODE:
            continue
        for number in range(token.start[0], token.end[0] + 1):
            if lines[number - 1].strip() and number not in docstrings:
                code.add(number)
    return code


#: Ruby's own lexer: prints, per file given, the numbers of its code lines (lines a
#: token other than a comment, =begin/=end block or white space touches; stops at __END__).
RUBY_COUNTER = r"""
require "json"
require "ripper"
TRIVIA = %i[on_sp on_nl on_ignored_nl on_comment on_embdoc_beg on_embdoc on_embdoc_end
            on_ignored_sp on_words_sep]
counts = ARGV.to_h do |path|
  text = File.read(path)
  lines = text.lines
  code = []
  Ripper.lex(text).each do |(line, _col), type, token|
    break if type == :on___end__
    next if TRIVIA.include?(type)
    (line..line + token.chomp.count("\n")).each { |n| code << n if lines[n - 1].to_s.strip != "" }
  end
  [path, code.uniq.sort]
end
puts JSON.generate(counts)
"""


def ruby_code_lines(paths: list[Path]) -> dict[str, list[int]]:
    """Each Ruby file's code line numbers, by Ripper (``ruby`` on the PATH)."""
    done = subprocess.run(
        ["ruby", "-e", RUBY_COUNTER, *map(str, paths)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def door_files(door: str) -> list[Path]:
    """The files of ``door`` (``DOORS``), each present."""
    files = sorted({path for pattern in DOORS[door] for path in ROOT.glob(pattern)})
    assert files, f"{door}: no file matches {DOORS[door]}"
    return files


def code_lines(door: str) -> dict[str, int]:
    """Each file of ``door`` (relative path) → its count of code lines."""
    files = door_files(door)
    if files[0].suffix == ".rb":
        counted = ruby_code_lines(files)
        return {str(Path(path).relative_to(ROOT)): len(lines) for path, lines in counted.items()}
    return {str(path.relative_to(ROOT)): len(python_code_lines(path.read_text())) for path in files}


def test_the_counter_skips_comments_docstrings_and_blank_lines_only():
    text = '''"""Module doc."""
# a comment

def f(x):
    """Doc
    on two lines."""
    s = """# not a comment
"""  # a comment after code
    return "# nor this"  # but this is
'''
    assert sorted(python_code_lines(text)) == [4, 7, 8, 9]


def test_the_ruby_counter_skips_comments_and_blank_lines_only(tmp_path):
    text = "# frozen_string_literal: true\n\n# doc\ndef f\n  s = <<~T\n    # not a comment\n  T\n"
    text += '  "#x" # c\nend\n'
    path = tmp_path / "door.rb"
    path.write_text(text)
    assert ruby_code_lines([path])[str(path)] == [4, 5, 6, 7, 8, 9]


@pytest.mark.parametrize("door", sorted(DOORS))
def test_a_door_is_at_most_250_code_lines(door):
    counts = code_lines(door)
    total = sum(counts.values())
    assert total <= MAX_CODE_LINES, (
        f"the {door} door is {total} code lines (at most {MAX_CODE_LINES}, docs/design.md): {counts}; "
        "move what is not its queue's vocabulary to the core or to a module of its own"
    )


@pytest.mark.parametrize("first", ["idempotent_job.sqs", "idempotent_job._sqs_runtime"])
def test_the_sqs_runtimes_keep_their_documented_import_path(first):
    # The runtimes moved out of the SQS door are still imported from idempotent_job.sqs
    # (python/README.md), whichever module a process imports first.
    script = (
        f"import sys, {first}\n"
        "from idempotent_job.sqs import *\n"
        "from idempotent_job.sqs import Consumer, Message, batch_handler, resender\n"
        "import idempotent_job.sqs as sqs, idempotent_job._sqs_runtime as runtime\n"
        "assert Consumer is runtime.Consumer and resender is runtime.resender\n"
        "assert batch_handler is runtime.batch_handler\n"
        "assert set(sqs.__all__) <= set(dir(sqs)), dir(sqs)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
