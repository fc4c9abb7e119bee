"""``remat docs [NAME[#SECTION]]``: the documentation shipped with the package, read offline."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..._errors import RematError, short, sorted_list
from ..._shipped import DOCS_URL, anchor_in, doc_url, docs_dir, headings, pages, section


class DocsError(RematError):
    """A page or section that the shipped documentation does not have."""


def resolve(name: str) -> tuple[str, str]:
    """``(page, anchor)`` for what a user types or pastes: ``tune``, ``tune.md``,
    ``docs/tune.md``, a page's web address (any link in a message), each with an optional
    ``#SECTION`` (the heading's anchor or its title).

    >>> resolve("docs/semantics.md#plan-files-in-an-editor")
    ('semantics', 'plan-files-in-an-editor')
    >>> resolve(doc_url("core"))
    ('core', '')
    """
    text, _, anchor = name.strip().partition("#")
    have = pages()
    core = doc_url("core")
    page = ("core" if text in (core, "common/README.md") else
            text.removeprefix(f"{DOCS_URL}/").removeprefix("docs/").removesuffix(".md"))
    if page not in have:
        raise DocsError(f"no page {short(text)}. Pages: {sorted_list(have)}. Fix: "
                        "remat docs NAME with one of them (remat docs lists them with their "
                        "titles).")
    if anchor:
        text = have[page].read_text("utf-8")
        if anchor_in(text, anchor) is None:
            raise DocsError(f"{page} has no section {short(anchor)}. Its sections: "
                            f"{sorted_list(h[2] for h in headings(text))}. Fix: remat docs "
                            f"{page}#SECTION with one of them, or the page alone.")
    return page, anchor


def run(args: argparse.Namespace) -> int:
    if args.name is None:
        if args.path or args.url:
            print(docs_dir() if args.path else DOCS_URL)
            return 0
        listed = pages()
        width = max(map(len, listed))
        print(f"The documentation, shipped in {docs_dir()} (on the web: {DOCS_URL}):")
        for name, path in listed.items():
            title = next(iter(headings(path.read_text("utf-8"))), (0, "", ""))[1]
            print(f"  {name:<{width}}  {title}")
        print("remat docs NAME prints a page; NAME#SECTION one section of it (its anchor or title); "
              "--path its file, --url its web address.")
        return 0
    page, anchor = resolve(args.name)
    path = pages()[page]
    if args.path:
        print(path)
    elif args.url:
        print(doc_url(page, anchor_in(path.read_text("utf-8"), anchor) or ""))
    else:
        text = path.read_text("utf-8")
        sys.stdout.write(section(text, anchor) or "" if anchor else text)
    return 0


ABOUT = ("Without NAME: the pages, with their titles. With NAME (semantics, tune, ...; "
         "also docs/NAME.md or a page's web address, as messages print them): the page; "
         "NAME#SECTION: one section (the heading's anchor or title).")


def register(p: Any) -> None:
    """``remat docs``'s arguments (its parser made by the ``remat`` command line)."""
    p.add_argument("name", nargs="?", metavar="NAME[#SECTION]", help="the page, and a section")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--path", action="store_true", help="print the page's file instead")
    how.add_argument("--url", action="store_true", help="print the page's web address instead")
    p.set_defaults(func=run)
