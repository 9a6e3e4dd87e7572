"""What an image needs of the development venv: the closure of some requirements, pinned.

Run by scripts/build-images.sh with the venv's Python (requirements/dev.lock installed):

    closure.py pins --python 3.11.2 [--without NAME]... REQUIREMENT...
        one line per distribution the requirements need on that Python (markers evaluated
        for it, extras followed): ``name==version`` for what the venv has, else the
        requirement as written (a dependency only that Python needs). The wheelhouse is
        downloaded from these with ``pip download --no-deps``: no resolver run.

    closure.py stage --python 3.11.2 [--without NAME]... DIR REQUIREMENT...
        hard-links the installed files of that closure (their RECORD entries inside
        site-packages, no bytecode) into DIR, which then holds a ready site-packages tree;
        fails on a dependency the venv lacks. The vllm-cpu stand-in copies it: the runner
        image runs exactly the torch, vLLM and transformers the tests run, and the build
        downloads and unpacks none of their ~3 GB again.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import sysconfig
from importlib import metadata

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def environment(python: str) -> dict[str, str]:
    env = default_environment()
    env["python_full_version"] = python
    env["python_version"] = ".".join(python.split(".")[:2])
    return env


def applies(req: Requirement, env: dict[str, str], extras: set[str]) -> bool:
    if req.marker is None:
        return True
    return any(req.marker.evaluate({**env, "extra": e}) for e in (extras or {""}))


def walk(
    roots: list[str], python: str, without: list[str]
) -> tuple[dict[str, metadata.Distribution], list[str]]:
    """(installed distributions of the closure by name, requirements the venv lacks),
    leaving out the distributions named in ``without`` (and what only they need)."""
    env = environment(python)
    skip = {canonicalize_name(n) for n in without}
    found: dict[str, metadata.Distribution] = {}
    followed: dict[str, set[str]] = {}
    lacking: dict[str, str] = {}
    todo = [(Requirement(r), {""}) for r in roots]
    while todo:
        req, parent_extras = todo.pop()
        if not applies(req, env, parent_extras):
            continue
        name = canonicalize_name(req.name)
        if name in skip:
            continue
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            lacking.setdefault(name, str(req).split(";")[0].strip())
            continue
        if not req.specifier.contains(dist.version, prereleases=True):
            sys.exit(f"closure: the venv has {req.name} {dist.version}, {req} needs another")
        extras = set(req.extras) | {""}
        if name in followed and extras <= followed[name]:
            continue
        followed[name] = followed.get(name, set()) | extras
        found[name] = dist
        for dep in dist.requires or []:
            todo.append((Requirement(dep), extras))
    return found, sorted(lacking.values())


def pins(args: argparse.Namespace) -> None:
    found, lacking = walk(args.requirements, args.python, args.without)
    for name, dist in sorted(found.items()):
        print(f"{name}=={dist.version}")
    for req in lacking:
        print(req)


def stage(args: argparse.Namespace) -> None:
    found, lacking = walk(args.requirements, args.python, args.without)
    if lacking:
        sys.exit(f"closure: the venv lacks {', '.join(lacking)} (needed on {args.python})")
    bases = {os.path.realpath(sysconfig.get_paths()[k]) for k in ("purelib", "platlib")}
    out = os.path.abspath(args.dir)
    os.makedirs(out, exist_ok=True)
    made: set[str] = set()
    count = 0
    for dist in found.values():
        root = os.path.realpath(str(dist.locate_file("")))
        if root not in bases:
            continue
        for entry in dist.files or []:
            rel = os.path.normpath(str(entry))
            # console scripts and data files lie outside site-packages (../../bin/...)
            if rel.startswith("..") or "__pycache__" in rel or rel.endswith(".pyc"):
                continue
            source = os.path.join(root, rel)
            target = os.path.join(out, rel)
            parent = os.path.dirname(target)
            if parent not in made:
                os.makedirs(parent, exist_ok=True)
                made.add(parent)
            try:
                os.link(source, target)
            except FileExistsError:
                continue
            except FileNotFoundError:
                continue  # listed in RECORD, removed since (none expected)
            except OSError:  # another file system
                shutil.copy2(source, target)
            count += 1
    print(f"closure: {len(found)} distributions, {count} files", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, func in (("pins", pins), ("stage", stage)):
        p = sub.add_parser(name)
        p.add_argument("--python", required=True, help="the image's Python version (3.11.2)")
        p.add_argument(
            "--without",
            action="append",
            default=[],
            metavar="NAME",
            help="leave this distribution out (and what only it needs)",
        )
        if name == "stage":
            p.add_argument("dir")
        p.add_argument("requirements", nargs="+")
        p.set_defaults(func=func)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
