"""Static check: every key a Lua script touches comes from ``KEYS``.

A tiny, scope-aware data-flow analysis over the scripts exactly as the
server runs them (prelude, declared ``lua/lib`` modules, operation file). An expression is
*key-safe* when it is a ``K_*`` name or ``KEYS[...]``, or a variable whose
every binding is key-safe: a local assignment, a ``for ... in ipairs(t)``
over a key-safe table, or a function parameter whose every call site passes
a key-safe argument. Tables are key-safe when every element ever put in
them is. Anything else used as the key of a ``redis.call`` (string
concatenation, ``ARGV``, a string literal, a function result) is reported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_TOKEN_RE = re.compile(
    r"""--\[\[.*?\]\]|--[^\n]*|"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|\[\[.*?\]\]"""
    r"""|[A-Za-z_][A-Za-z0-9_]*|\d+(?:\.\d+)?(?:e\d+)?|\.\.\.|\.\.|==|~=|<=|>=|\S""",
    re.S,
)
_OPENERS = {"function", "if", "do", "repeat"}
_CLOSERS = {"end", "until"}

#: Commands without a key, and where each other command keeps its key.
KEYLESS = {"TIME"}
CHANNEL_COMMANDS = {"PUBLISH", "SPUBLISH"}


def tokenize(source: str) -> list[str]:
    """Return Lua tokens without comments (strings kept as literals)."""
    return [t for t in _TOKEN_RE.findall(source) if not t.startswith("--")]


@dataclass
class Scope:
    """A function body (or the chunk's top level) and the names bound in it."""

    name: str
    params: list[str]
    tokens: list[str]
    bindings: dict[str, list[list[str]]] = field(default_factory=dict)
    elements: dict[str, list[list[str]]] = field(default_factory=dict)
    iterations: dict[str, list[list[str]]] = field(default_factory=dict)


def _split_args(tokens: list[str]) -> list[list[str]]:
    args: list[list[str]] = [[]]
    depth = 0
    for token in tokens:
        if token in "([{":
            depth += 1
        elif token in ")]}":
            depth -= 1
        if token == "," and depth == 0:
            args.append([])
        else:
            args[-1].append(token)
    return [arg for arg in args if arg]


def _closing(tokens: list[str], start: int) -> int:
    """Return the index of the bracket closing the one at ``start``."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    opener, depth = tokens[start], 0
    for index in range(start, len(tokens)):
        if tokens[index] == opener:
            depth += 1
        elif tokens[index] == pairs[opener]:
            depth -= 1
            if depth == 0:
                return index
    raise ValueError(f"unbalanced {opener}")


def _block_end(tokens: list[str], start: int) -> int:
    """Return the index of the ``end`` closing the block opened at ``start``.

    ``for`` and ``while`` open their block with ``do``; ``elseif``/``else``
    continue the block ``if`` opened.
    """
    depth = 0
    for index in range(start, len(tokens)):
        if tokens[index] in _OPENERS:
            depth += 1
        elif tokens[index] in _CLOSERS:
            depth -= 1
            if depth == 0:
                return index
    raise ValueError("unbalanced block")


def scopes(tokens: list[str]) -> list[Scope]:
    """Split a chunk into its top level and one scope per function body."""
    found: list[Scope] = []
    top: list[str] = []
    index = 0
    while index < len(tokens):
        if tokens[index] == "function":
            name = tokens[index + 1] if tokens[index + 1] != "(" else "<anonymous>"
            paren = tokens.index("(", index)
            close = _closing(tokens, paren)
            end = _block_end(tokens, index)
            params = [t for t in tokens[paren + 1 : close] if t != ","]
            found.append(Scope(name, params, tokens[close + 1 : end]))
            index = end + 1
            continue
        top.append(tokens[index])
        index += 1
    found.append(Scope("<top>", [], top))
    for scope in found:
        _collect(scope)
    return found


def _collect(scope: Scope) -> None:
    tokens = scope.tokens
    braces = 0
    for index, token in enumerate(tokens):
        braces += {"{": 1, "}": -1}.get(token, 0)
        if token == "for" and tokens[index + 2] in (",", "in"):
            names_end = tokens.index("in", index)
            names = [t for t in tokens[index + 1 : names_end] if t != ","]
            if tokens[names_end + 1] in ("ipairs", "pairs"):
                close = _closing(tokens, names_end + 2)
                scope.iterations.setdefault(names[-1], []).append(tokens[names_end + 3 : close])
            else:
                scope.iterations.setdefault(names[-1], []).append(["<iterator>"])
        elif token == "=" and braces == 0:  # not a field of a table constructor
            _assignment(scope, tokens, index)


def _value_end(tokens: list[str], index: int) -> int:
    """Return where the expression list starting after ``tokens[index]`` ends."""
    end = index + 1
    depth = 0
    while end < len(tokens):
        token = tokens[end]
        if token in "([{":
            depth += 1
        elif token in ")]}":
            depth -= 1
            if depth < 0:
                break
        elif depth == 0 and (
            token in _KEYWORDS or (end > index + 1 and _starts_statement(tokens, end))
        ):
            break
        end += 1
    return end


def _assignment(scope: Scope, tokens: list[str], index: int) -> None:
    value = tokens[index + 1 : _value_end(tokens, index)]
    if tokens[index - 1] == "]":  # t[...] = value: an element of table t
        depth, open_at = 0, index - 1
        while open_at >= 0:
            depth += {"]": 1, "[": -1}.get(tokens[open_at], 0)
            if depth == 0:
                break
            open_at -= 1
        scope.elements.setdefault(tokens[open_at - 1], []).append(value)
        return
    start = index - 1
    while start > 0 and (tokens[start - 1] == "," or tokens[start] == ","):
        start -= 1
    targets = [t for t in tokens[start:index] if t != ","]
    values = _split_args(value)
    for position, target in enumerate(targets):
        chosen = values[position] if position < len(values) else ["nil"]
        scope.bindings.setdefault(target, []).append(chosen)


_KEYWORDS = {"local", "if", "for", "while", "return", "end", "else", "elseif", "then", "do"}


def _starts_statement(tokens: list[str], index: int) -> bool:
    """A new statement starts at ``name =`` or ``name(`` after a complete expression."""
    previous, token = tokens[index - 1], tokens[index]
    if not re.fullmatch(r"[A-Za-z_]\w*", token):
        return False
    if previous in ("..", "+", "-", "*", "/", "%", "=", ",", "(", "[", "{", "and", "or", "not"):
        return False
    if previous in ("==", "~=", "<", ">", "<=", ">=", "^", "#", "."):
        return False
    return True


@dataclass
class Analysis:
    """Key-safety questions over every scope of one chunk."""

    scopes: list[Scope]

    def __post_init__(self) -> None:
        self._by_name = {scope.name: scope for scope in self.scopes}
        self._top = self.scopes[-1]
        self._active: set[tuple[str, str, str]] = set()

    def expression(self, tokens: list[str], scope: Scope) -> bool:
        """Return whether ``tokens`` (one expression) always evaluates to a namespace key."""
        if len(tokens) == 1 and re.fullmatch(r"K_[A-Z_]+", tokens[0]):
            return True
        if (
            tokens[:2] == ["KEYS", "["]
            and tokens[-1] == "]"
            and _closing(tokens, 1) == len(tokens) - 1
        ):
            return True
        if len(tokens) == 1 and re.fullmatch(r"[A-Za-z_]\w*", tokens[0]):
            return self._variable(tokens[0], scope, "key")
        return False

    def table(self, tokens: list[str], scope: Scope) -> bool:
        """Return whether ``tokens`` is a table whose every element is key-safe."""
        if tokens and tokens[0] == "{" and _closing(tokens, 0) == len(tokens) - 1:
            return all(self.expression(arg, scope) for arg in _split_args(tokens[1:-1]))
        if len(tokens) == 1 and re.fullmatch(r"[A-Za-z_]\w*", tokens[0]):
            return self._variable(tokens[0], scope, "table")
        return False

    def _variable(self, name: str, scope: Scope, kind: str) -> bool:
        marker = (scope.name, name, kind)
        if marker in self._active:
            return False  # a cycle proves nothing
        self._active.add(marker)
        try:
            return self._variable_uncached(name, scope, kind)
        finally:
            self._active.discard(marker)

    def _variable_uncached(self, name: str, scope: Scope, kind: str) -> bool:
        bound = name in scope.params or name in scope.bindings or name in scope.iterations
        if not bound and scope is not self._top:
            return self._variable(name, self._top, kind)
        if not bound:
            return False
        check = self.expression if kind == "key" else self.table
        if not all(check(value, scope) for value in scope.bindings.get(name, [])):
            return False
        if kind == "key":
            if not all(self.table(t, scope) for t in scope.iterations.get(name, [])):
                return False
        else:
            if name in scope.iterations:
                return False
            if not all(self.expression(v, scope) for v in scope.elements.get(name, [])):
                return False
        if name in scope.params:
            position = scope.params.index(name)
            calls = list(self.calls(scope.name))
            if not calls:
                return not self._referenced(scope.name)  # never called: dead code here
            return all(
                position < len(args) and check(args[position], caller) for caller, args in calls
            )
        return True

    def _referenced(self, function: str) -> bool:
        """Return whether ``function`` is used as a value (passed, stored) anywhere."""
        for scope in self.scopes:
            tokens = scope.tokens
            for index, token in enumerate(tokens):
                if token == function and (index + 1 == len(tokens) or tokens[index + 1] != "("):
                    return True
        return False

    def calls(self, function: str) -> list[tuple[Scope, list[list[str]]]]:
        """Return (calling scope, arguments) of every call of ``function``."""
        out = []
        for scope in self.scopes:
            tokens = scope.tokens
            for index, token in enumerate(tokens[:-1]):
                if (
                    token == function
                    and tokens[index + 1] == "("
                    and (index == 0 or tokens[index - 1] not in ("function", "."))
                ):
                    close = _closing(tokens, index + 1)
                    out.append((scope, _split_args(tokens[index + 2 : close])))
        return out


def _binding_problems(analysis: Analysis) -> list[str]:
    """K_* names are bound only to KEYS[n], the wake prefix only to ARGV[1].

    The prelude binds them in ``bind()`` (called with the script's own KEYS
    and ARGV, or a function's ``keys`` and ``args``), or at the top.
    """
    allowed = {analysis.scopes[-1].name, "bind"}
    problems = [
        f"{scope.name}: {name} bound to {' '.join(value)}"
        for scope in analysis.scopes
        for name, values in scope.bindings.items()
        for value in values
        if name.startswith("K_") and (scope.name not in allowed or value[:2] != ["KEYS", "["])
    ]
    wake = [
        value
        for scope in analysis.scopes
        for value in scope.bindings.get("WAKE_PREFIX", [])
        if scope.name in allowed
    ]
    strays = [s.name for s in analysis.scopes if "WAKE_PREFIX" in s.bindings]
    if wake != [["ARGV", "[", "1", "]"]] or any(name not in allowed for name in strays):
        problems.append(f"WAKE_PREFIX is bound to {wake} in {strays}")
    return problems


def _redis_calls(scope: Scope) -> list[list[list[str]]]:
    """Return the argument lists of every ``redis.call``/``redis.pcall`` in ``scope``."""
    tokens = scope.tokens
    calls = []
    for index in range(len(tokens) - 3):
        if tokens[index : index + 3] in (["redis", ".", "call"], ["redis", ".", "pcall"]):
            close = _closing(tokens, index + 3)
            calls.append(_split_args(tokens[index + 4 : close]))
    return calls


def _call_problem(analysis: Analysis, scope: Scope, args: list[list[str]]) -> str | None:
    where = f"{scope.name}: redis.call({' '.join(' '.join(a) for a in args)[:80]})"
    command = args[0][0] if len(args[0]) == 1 else ""
    if not re.fullmatch(r"'[A-Z]+'", command):
        return f"{where}: command is not a literal"
    name = command.strip("'")
    key = args[1] if len(args) > 1 else []
    if name in KEYLESS or key == ["unpack", "(", "KEYS", ")"]:
        return None
    if name in CHANNEL_COMMANDS:
        return None if key[:2] == ["WAKE_PREFIX", ".."] else f"{where}: foreign channel"
    return None if analysis.expression(key, scope) else f"{where}: key not provably from KEYS"


def violations(source: str) -> list[str]:
    """Return every redis.call whose command or key is not provably a namespace key."""
    analysis = Analysis(scopes(tokenize(source)))
    problems = _binding_problems(analysis)
    for scope in analysis.scopes:
        for args in _redis_calls(scope):
            problem = _call_problem(analysis, scope, args)
            if problem:
                problems.append(problem)
    return problems
