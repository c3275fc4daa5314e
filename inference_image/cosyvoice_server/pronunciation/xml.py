"""Untrusted XML, parsed by defusedxml's expat parser: no DTD (so no entity can be declared, and billion
laughs or an external entity is refused at its `<!DOCTYPE`), no processing beyond the document itself, and
caps on size and element depth checked before and while parsing, so hostile input costs microseconds."""

from __future__ import annotations

from collections.abc import Callable

from defusedxml import DefusedXmlException
from defusedxml.ElementTree import DefusedXMLParser, ParseError


class XmlError(ValueError):
    """The document is not one this server reads; the message says why (and at which line)."""


def local(tag: str) -> tuple[str | None, str]:
    """`{namespace}name` -> (namespace, name)."""
    if tag.startswith("{"):
        ns, _, name = tag[1:].partition("}")
        return ns, name
    return None, tag


class Parser:
    """Feeds XML text to `target` (start(tag, attrib, line), end(tag, line), data(text)), incrementally."""

    def __init__(self, target, max_chars: int, max_depth: int, what: str) -> None:
        self.target = target
        self.max_chars = max_chars
        self.max_depth = max_depth
        self.what = what
        self.fed = 0
        self.depth = 0
        self._parser = DefusedXMLParser(target=self, forbid_dtd=True, forbid_entities=True, forbid_external=True)
        self._expat = self._parser.parser

    @property
    def line(self) -> int:
        return self._expat.CurrentLineNumber

    # The parser's target: depth is checked at each start tag, before anything deeper is read.
    def start(self, tag: str, attrib: dict[str, str]) -> None:
        self.depth += 1
        if self.depth > self.max_depth:
            raise XmlError(f"the {self.what} nests elements more than {self.max_depth} deep (line {self.line})")
        self.target.start(tag, attrib, self.line)

    def end(self, tag: str) -> None:
        self.depth -= 1
        self.target.end(tag, self.line)

    def data(self, text: str) -> None:
        self.target.data(text)

    def close(self):
        return None

    def feed(self, text: str) -> None:
        self.fed += len(text)
        if self.fed > self.max_chars:
            raise XmlError(f"the {self.what} is longer than {self.max_chars} characters")
        self._call(self._parser.feed, text)

    def close_document(self) -> None:
        self._call(self._parser.close)

    def _call(self, fn: Callable, *args) -> None:
        try:
            fn(*args)
        except XmlError:
            raise
        except DefusedXmlException as exc:
            raise XmlError(f"the {self.what} declares a DTD or entities ({exc.__class__.__name__}), which are not "
                           "accepted") from None
        except ParseError as exc:
            raise XmlError(f"the {self.what} is not well-formed XML: {exc}") from None


def parse(text: str, target, max_chars: int, max_depth: int, what: str) -> None:
    """Parses a whole document into `target`."""
    p = Parser(target, max_chars, max_depth, what)
    p.feed(text)
    p.close_document()
