#!/usr/bin/env python3
"""Fails when the code and docs/ disagree on what a user can set.

Three kinds of names are taken from the code, by the constructs that read
them, and compared with the reference tables of docs/ in both directions
(in the code but not documented; documented but gone from the code):

  TANDEM_* variables  string literals of src/, include/, tools/, examples/,
                      tests/cudaemu/*.cc (the CUDA emulator),
                      python/ (C, C++, Python) and $TANDEM_* in scripts/;
                      against the first column of docs/environment.md's
                      tables. Any TANDEM_* name anywhere in docs/ or
                      README.md must also exist in the code.
  config keys         the key tables (`static const char *const ...keys[]`)
                      and key comparisons (`strcmp(k, "...")`) of every
                      src/ file that parses JSON (uses cJSON); against the
                      leaves of the dotted keys in docs/config.md's tables;
                      the root object's keys (the table checked with section
                      "") must have undotted rows, and undotted rows must be
                      root keys.
  program flags       per program: the literals a tools/*.c or examples/*.c
                      program (with the examples/*.h it includes) compares
                      argv with (strcmp, app_flag_value), tandem-bench's
                      one-letter switch, tandem-ckpt's and tandem-bench's
                      commands, the Python examples' add_argument and
                      `--flag)` case patterns of scripts/*; against the
                      table that follows `<!-- flags: PROGRAM -->` in docs/.

It also checks that every relative link of README.md and docs/ names a file
that exists and, with #anchor, a heading of that file, and that every path
of the repository written in backquotes (`src/...`, `tests/...`) exists, so
that moving a file cannot leave the docs pointing at its old place.

Run from anywhere: python3 tests/docs/check_docs.py [REPO]. Prints what is
missing where and exits 1, or prints a summary and exits 0.
"""
import glob
import os
import re
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
problems = []


def read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def rel(path):
    return os.path.relpath(path, ROOT)


def files(patterns):
    out = []
    for p in patterns:
        out += glob.glob(os.path.join(ROOT, p), recursive=True)
    return sorted(set(f for f in out if os.path.isfile(f)))


C_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')
PY_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'')
ENV_NAME = re.compile(r"\bTANDEM_[A-Z0-9_]*[A-Z0-9]\b")


def strip_c_comments(text):
    # Keep string literals intact: blank out comments only where they are not inside a string.
    out, i = [], 0
    for m in re.finditer(r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'|/\*.*?\*/|//[^\n]*', text, re.S):
        out.append(text[i:m.start()])
        tok = m.group(0)
        out.append(tok if tok[0] in "\"'" else "\n" * tok.count("\n"))
        i = m.end()
    out.append(text[i:])
    return "".join(out)


def table_first_cells(text):
    """Backticked names in the first cell of each table row of a markdown text."""
    names = []
    for line in text.splitlines():
        s = line.strip()
        if not s.startswith("|") or re.match(r"^\|[\s:|-]+\|?$", s):
            continue
        cell = re.split(r"(?<!\\)\|", s)[1]  # "\|" inside a cell is a literal bar
        names += re.findall(r"`([^`]+)`", cell)
    return names


# ---------------------------------------------------------------- variables
def code_env_vars():
    found = {}
    for path in files(["src/**/*.c", "src/**/*.h", "src/**/*.cu", "src/**/*.cuh", "include/**/*.h", "tools/*.c",
                       "examples/**/*.c", "examples/**/*.h", "examples/**/*.py", "python/**/*.c",
                       "python/**/*.cpp", "python/**/*.h", "python/**/*.py",
                       "tests/cudaemu/*.cc"]):
        text = read(path)
        if path.endswith(".py"):
            text = re.sub(r"(?m)^\s*#.*$", "", text)
            literals = PY_STRING.findall(text)
        else:
            literals = C_STRING.findall(strip_c_comments(text))
        for lit in literals:
            for name in ENV_NAME.findall(lit):
                found.setdefault(name, rel(path))
    for path in files(["scripts/*"]):
        for name in re.findall(r"\$\{?(TANDEM_[A-Z0-9_]*[A-Z0-9])", read(path)):
            found.setdefault(name, rel(path))
    return found


def check_env():
    code = code_env_vars()
    env_page = os.path.join(ROOT, "docs", "environment.md")
    if not os.path.exists(env_page):
        problems.append("docs/environment.md is missing: it is the one page that lists every TANDEM_* variable")
        return len(code)
    documented = set()
    for cell in table_first_cells(read(env_page)):
        documented.update(ENV_NAME.findall(cell))
    for name in sorted(set(code) - documented):
        problems.append(f"variable {name} is read or set in {code[name]} but has no row in docs/environment.md")
    for name in sorted(documented - set(code)):
        problems.append(f"variable {name} has a row in docs/environment.md but no code reads or sets it")
    for path in files(["docs/**/*.md", "README.md"]):
        gone = set(ENV_NAME.findall(read(path))) - set(code)
        if os.path.samefile(path, env_page):
            gone -= documented  # reported above
        for name in sorted(gone):
            problems.append(f"variable {name} is named in {rel(path)} but no code reads or sets it")
    return len(code)


# ---------------------------------------------------------------- config keys
KEY_TABLE = re.compile(r"static\s+const\s+char\s*\*\s*const\s+\w*keys\s*\[\s*\]\s*=\s*\{(.*?)\}\s*;", re.S)
KEY_COMPARE = re.compile(r"strcmp\(\s*(?:k|key|item->string|it->string)\s*,\s*\"([A-Za-z0-9_]+)\"\s*\)")


ROOT_CHECK = re.compile(r"check_keys\(\s*\w+\s*,\s*\w+\s*,\s*\"\"\s*,")


def code_config_keys():
    """All keys (by leaf name), and the top-level ones: the key table nearest
    before the check_keys call whose section is "" (the root object)."""
    found, top = {}, set()
    for path in files(["src/**/*.c"]):
        text = strip_c_comments(read(path))
        if "cJSON" not in text:
            continue
        tables = list(KEY_TABLE.finditer(text))
        for table in tables:
            for key in re.findall(r'"([A-Za-z0-9_]+)"', table.group(1)):
                found.setdefault(key, rel(path))
        for key in KEY_COMPARE.findall(text):
            found.setdefault(key, rel(path))
        for call in ROOT_CHECK.finditer(text):
            before = [t for t in tables if t.end() <= call.start()]
            if before:
                top.update(re.findall(r'"([A-Za-z0-9_]+)"', before[-1].group(1)))
    return found, top


def check_config():
    code, top = code_config_keys()
    page = os.path.join(ROOT, "docs", "config.md")
    if not os.path.exists(page):
        problems.append("docs/config.md is missing: it is the reference of every config key")
        return len(code)
    leaves, documented_top = {}, set()
    for cell in table_first_cells(read(page)):
        if re.fullmatch(r"[A-Za-z0-9_.\[\]]+", cell):
            leaves.setdefault(cell.split(".")[-1].replace("[]", ""), cell)
            if "." not in cell:
                documented_top.add(cell)
    if not top:
        problems.append("found no top-level key table (check_keys(..., \"\", keys, ...)) in src/: the extraction "
                        "no longer matches the config parser; update tests/docs/check_docs.py")
    for key in sorted(top - documented_top):
        problems.append(f"top-level config key \"{key}\" has no row `{key}` (undotted) in docs/config.md")
    for key in sorted(documented_top - top):
        problems.append(f"docs/config.md has a top-level row `{key}` but the config's root accepts no such key")
    for key in sorted(set(code) - set(leaves)):
        problems.append(f"config key \"{key}\" is parsed in {code[key]} but has no row in docs/config.md")
    for leaf in sorted(set(leaves) - set(code)):
        problems.append(f"config key {leaves[leaf]} has a row in docs/config.md but no parser accepts \"{leaf}\"")
    return len(code)


# ---------------------------------------------------------------- program flags
FLAG_COMPARE = re.compile(r"(?:strcmp\(\s*[^,()\"]+\s*,|app_flag_value\([^\"()]*?)\s*\"(-{1,2}[A-Za-z][A-Za-z0-9-]*)\"")


def c_program_flags(path):
    text = strip_c_comments(read(path))
    flags = set(FLAG_COMPARE.findall(text))
    # one-letter options read by a switch on the flag's second character (tandem-bench)
    for m in re.finditer(r"switch\s*\(\s*flag\[1\]\s*\)\s*\{(.*?)default\s*:", text, re.S):
        flags.update("-" + c for c in re.findall(r"case\s+'([A-Za-z])'\s*:", m.group(1)))
    # commands: tandem-ckpt's strcmp(cmd, ...) and tandem-bench's kinds[] table
    flags.update(re.findall(r"strcmp\(\s*cmd\s*,\s*\"([a-z_]+)\"\s*\)", text))
    m = re.search(r"\bkinds\[\]\s*=\s*\{(.*?)\}\s*;", text, re.S)
    if m:
        flags.update(re.findall(r"\{\s*\"([a-z_]+)\"\s*,", m.group(1)))
    for inc in re.findall(r'#include\s+"([^"/]+\.h)"', read(path)):
        header = os.path.join(os.path.dirname(path), inc)
        if os.path.exists(header):
            flags |= c_program_flags(header)
    return flags


PY_FLAG = re.compile(r"add_argument\(\s*[\"'](-{1,2}[A-Za-z][A-Za-z0-9-]*)[\"']")


def code_programs():
    progs = {}
    for path in files(["tools/*.c", "examples/*.c"]):
        progs[os.path.splitext(os.path.basename(path))[0]] = (c_program_flags(path), rel(path))
    # Python programs in tools/ (a file without .c that starts with a python shebang)
    for path in files(["tools/*"]):
        if not path.endswith(".c") and read(path).startswith("#!") and "python" in read(path).split("\n", 1)[0]:
            progs[os.path.basename(path)] = (set(PY_FLAG.findall(read(path))), rel(path))
    py = set()
    for path in files(["examples/python/*.py"]):
        py.update(PY_FLAG.findall(read(path)))
    if py:
        progs["examples/python"] = (py, "examples/python/*.py")
    for path in files(["scripts/*"]):
        flags = set(re.findall(r"^\s*(--?[A-Za-z][A-Za-z0-9-]*)(?:\|[^)]*)?\)", read(path), re.M))
        if flags:
            progs["scripts/" + os.path.basename(path)] = (flags, rel(path))
    return progs


def documented_programs():
    docs = {}
    for path in files(["docs/**/*.md"]):
        lines = read(path).splitlines()
        for i, line in enumerate(lines):
            m = re.match(r"\s*<!--\s*flags:\s*(\S+)\s*-->", line)
            if not m:
                continue
            table = []
            for nxt in lines[i + 1:]:
                if nxt.strip().startswith("|"):
                    table.append(nxt)
                elif table or nxt.strip():
                    break
            names = set()
            for cell in table_first_cells("\n".join(table)):
                word = cell.split()[0] if cell.split() else ""
                word = word.split("=")[0]
                if re.fullmatch(r"-{0,2}[A-Za-z][A-Za-z0-9_-]*", word):
                    names.add(word)
            if not table:
                problems.append(f"{rel(path)}:{i + 1}: <!-- flags: {m.group(1)} --> is not followed by a table")
            docs.setdefault(m.group(1), [set(), rel(path)])[0].update(names)
    return docs


def check_flags():
    code = code_programs()
    docs = documented_programs()
    n = 0
    for prog, (flags, src) in sorted(code.items()):
        n += len(flags)
        if prog not in docs:
            problems.append(f"program {prog} ({src}) has no flag table in docs/ (a table after <!-- flags: {prog} -->)")
            continue
        have, page = docs[prog]
        for f in sorted(flags - have):
            problems.append(f"{prog}: {f} is accepted by {src} but missing from the flag table in {page}")
        for f in sorted(have - flags):
            problems.append(f"{prog}: {f} is in the flag table in {page} but {src} does not accept it")
    for prog in sorted(set(docs) - set(code)):
        problems.append(f"{docs[prog][1]} has a flag table for {prog}, which is not a program of tools/, examples/ or scripts/")
    return n


# ---------------------------------------------------------------- links
def anchors(path):
    """GitHub's anchors for the headings of a markdown file."""
    out = set()
    in_code = False
    for line in read(path).splitlines():
        if line.startswith("```"):
            in_code = not in_code
        m = None if in_code else re.match(r"#{1,6}\s+(.*)", line)
        if m:
            text = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower())
            out.add(text.replace(" ", "-"))
    return out


def check_links():
    n = 0
    for path in files(["README.md", "docs/**/*.md"]):
        text = re.sub(r"```.*?```", "", read(path), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            n += 1
            file_part, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            if not os.path.exists(dest):
                problems.append(f"{rel(path)}: the link ({target}) names {rel(dest)}, which does not exist")
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                problems.append(f"{rel(path)}: the link ({target}) names a heading that {rel(dest)} does not have")
    return n


REPO_PATH = re.compile(r"`((?:src|include|tools|examples|python|tests|bench|scripts|docs)/[A-Za-z0-9_./-]+)`")


def check_paths():
    n = 0
    for path in files(["README.md", "docs/**/*.md"]):
        for p in sorted(set(REPO_PATH.findall(read(path)))):
            if "DATE" in p:  # a pattern such as bench/results/zperf-DATE.md
                continue
            n += 1
            if not os.path.exists(os.path.join(ROOT, p)):
                problems.append(f"{rel(path)} names `{p}`, which does not exist")
    return n


def main():
    n_links = check_links() + check_paths()
    n_env = check_env()
    n_keys = check_config()
    n_flags = check_flags()
    if n_env == 0 or n_keys == 0 or n_flags == 0:
        problems.append(f"found {n_env} variables, {n_keys} config keys, {n_flags} flags in the code: the extraction "
                        "no longer matches how the code reads them; update tests/docs/check_docs.py")
    if problems:
        for p in problems:
            print("check_docs: " + p)
        print(f"check_docs: {len(problems)} problem(s)")
        return 1
    print(f"check_docs: docs/ agrees with the code: {n_env} TANDEM_* variables, {n_keys} config keys, "
          f"{n_flags} program flags and commands; {n_links} links and paths resolve")
    return 0


if __name__ == "__main__":
    sys.exit(main())
