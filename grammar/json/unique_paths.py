"""Where in an instance the arrays are whose uniqueItems the matcher keeps (json.unique).

The regex or grammar of such an array admits duplicates; the matcher refuses them, so it must
know, from the text read so far, whether the array it is in is one of them. It knows the path of
keys and array items that leads there; this module turns the schema into path patterns: each
step an object key, ANY_KEY (patternProperties, additionalProperties) or ITEM (any array
position). A pattern may match an array that another branch of an anyOf put there: uniqueness is
then enforced on it too, a narrowing, never a relaxation.
"""
from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field

from gdserve.grammar.errors import GrammarError
from gdserve.grammar.json.schema_model import pointer_token, show_pointer

ITEM = 0      # path step: an array item, any position
ANY_KEY = 1   # path step: an object member whose key no declared property names
MAX_VISITS = 20_000  # schema positions one walk visits (shared $defs are walked once per use)

PathStep = str | int
Path = tuple[PathStep, ...]

_SAME_PATH = ("allOf", "anyOf", "oneOf")
_SAME_PATH_ONE = ("then", "else")
_ANY_KEY_ONE = ("additionalProperties", "unevaluatedProperties")
_ITEM_ONE = ("additionalItems", "unevaluatedItems", "contains")


def unique_array_paths(schema: object, pointers: list[str]) -> frozenset[Path]:
    """The instance paths of the arrays whose uniqueItems keywords (their schema pointers, as
    json.schema's unique_items lists them) the matcher keeps. GrammarError where such an array
    sits inside a $ref cycle (its paths are unbounded) or where the walk cannot find it."""
    walk = _Walk(schema, frozenset(pointers))
    walk.visit(schema, "", (), frozenset())
    missing = set(pointers) - walk.found
    if missing:
        raise GrammarError(f"unsupported uniqueItems at {show_pointer(min(missing))} (its place in the "
                           "instance cannot be located)")
    return frozenset(walk.paths)


def matches(pattern: Path, frames: tuple) -> bool:
    """Whether `pattern` names the container path `frames` (one step per open container: the
    object's current key, or ITEM for an array)."""
    if len(pattern) != len(frames):
        return False
    return all(p == f or (p == ANY_KEY and f != ITEM) for p, f in zip(pattern, frames))


@dataclass
class _Walk:
    root: object
    pointers: frozenset[str]
    paths: set[Path] = field(default_factory=set)
    found: set[str] = field(default_factory=set)
    visits: int = 0

    def visit(self, schema: object, ptr: str, path: Path, refs: frozenset[str]) -> None:
        if not isinstance(schema, dict):
            return
        self.visits += 1
        if self.visits > MAX_VISITS:
            raise GrammarError(f"unsupported uniqueItems at {show_pointer(min(self.pointers))} (the schema "
                               f"has more than {MAX_VISITS} positions to search for it)")
        if schema.get("uniqueItems") is True and ptr in self.pointers:
            self.found.add(ptr)
            self.paths.add(path)
        ref = schema.get("$ref")
        if isinstance(ref, str):
            self._follow(ref, ptr, path, refs)
        self._children(schema, ptr, path, refs)

    def _follow(self, ref: str, ptr: str, path: Path, refs: frozenset[str]) -> None:
        uri, frag = urllib.parse.urldefrag(ref)
        target = urllib.parse.unquote(frag)
        if uri or not (target == "" or target.startswith("/")):
            return  # $id and $anchor refs: not followed (unique_array_paths reports what it missed)
        if target in refs:
            if self._reaches_unique(target):
                raise GrammarError(f"unsupported uniqueItems inside the recursive schema at "
                                   f"{show_pointer(target)} (unique arrays at unbounded depth)")
            return
        node = _pointer(self.root, target)
        self.visit(node, target, path, refs | {target})

    def _children(self, s: dict, ptr: str, path: Path, refs: frozenset[str]) -> None:
        for k, sub in _dict(s.get("properties")).items():
            self.visit(sub, f"{ptr}/properties/{pointer_token(k)}", path + (k,), refs)
        for k, sub in _dict(s.get("patternProperties")).items():
            self.visit(sub, f"{ptr}/patternProperties/{pointer_token(k)}", path + (ANY_KEY,), refs)
        for k, sub in _dict(s.get("dependentSchemas")).items():
            self.visit(sub, f"{ptr}/dependentSchemas/{pointer_token(k)}", path, refs)
        for kw in _ANY_KEY_ONE:
            self.visit(s.get(kw), f"{ptr}/{kw}", path + (ANY_KEY,), refs)
        for kw in _ITEM_ONE:
            self.visit(s.get(kw), f"{ptr}/{kw}", path + (ITEM,), refs)
        for kw in _SAME_PATH_ONE:
            self.visit(s.get(kw), f"{ptr}/{kw}", path, refs)
        items = s.get("items")
        if isinstance(items, list):
            for i, sub in enumerate(items):
                self.visit(sub, f"{ptr}/items/{i}", path + (ITEM,), refs)
        else:
            self.visit(items, f"{ptr}/items", path + (ITEM,), refs)
        for i, sub in enumerate(_list(s.get("prefixItems"))):
            self.visit(sub, f"{ptr}/prefixItems/{i}", path + (ITEM,), refs)
        for kw in _SAME_PATH:
            for i, sub in enumerate(_list(s.get(kw))):
                self.visit(sub, f"{ptr}/{kw}/{i}", path, refs)

    def _reaches_unique(self, target: str) -> bool:
        """Whether a uniqueItems the matcher keeps lies under the schema at `target`, local
        $refs followed."""
        todo, seen = [target], set()
        while todo:
            ptr = todo.pop()
            if ptr in seen:
                continue
            seen.add(ptr)
            if any(p == ptr or p.startswith(ptr + "/") for p in self.pointers):
                return True
            todo += _local_refs(_pointer(self.root, ptr))
        return False


def _local_refs(schema: object) -> list[str]:
    out, todo = [], [schema]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#"):
                out.append(urllib.parse.unquote(ref[1:]))
            todo += node.values()
        elif isinstance(node, list):
            todo += node
    return out


def _pointer(root: object, ptr: str) -> object:
    node = root
    for part in ptr.split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _dict(x: object) -> dict:
    return x if isinstance(x, dict) else {}


def _list(x: object) -> list:
    return x if isinstance(x, list) else []
