"""Eviction rules by path: ordered, the first match wins, the global policy last.

A rule is a small table, as in TOML or JSON:

    {path = "tool_outputs/**", max_age_steps = 5}
    {path = "src/**", pin = true}
    {path = "scratch/**", done_retention_steps = 0}

`path` is a glob over paths relative to the mount root: `*` and `?` stay
within one name, `**` spans any number of names (`a/**` is everything below
`a`, `**/x` is `x` anywhere), `[abc]` a class. A rule sets any of
`max_age_steps`, `done_retention_steps` (the global value for the others)
and `pin`. Rules are checked when the configuration is read, so a daemon
never starts with one it cannot apply; the error names the rule.

A glob is matched name by name, never by a backtracking regex: `*` within a
name and `**` over names each remember only their last position (the
classic wildcard walk), so a match costs at most the path's length times the
glob's, whatever names the agent chose. (As a regex, `**/*_*_*_*_*.json`
against three names froze the daemon 18-21 s in one step.)

Built-in rules (`BUILTIN_RULES`) follow the user's: they keep what an agent
framework holds as its canonical record, the only full copy of what left the
model's context window (Deep Agents' summarized history). The user's rules
come first, so one of them matching the same paths wins; the option
`builtin_eviction_rules = false` drops the built-ins altogether.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: what a rule may set, with the type its value must have
RULE_KEYS = {"path": str, "max_age_steps": int, "done_retention_steps": int, "pin": bool}
#: the most rules a volume takes: each candidate of a pass is matched against them
MAX_RULES = 256


@dataclass(frozen=True, slots=True)
class BuiltinRule:
    """A rule vfsd applies unless told otherwise, and why."""

    path: str
    why: str
    pin: bool = True


#: What the pinned deepagents (0.7.32) keeps as the canonical record, written
#: through the backend, so under the mount root (its `artifacts_root` is "/"):
#: nothing else holds these bytes where the model can read them back.
BUILTIN_RULES: tuple[BuiltinRule, ...] = (
    BuiltinRule(
        "conversation_history/**",
        "Deep Agents' records: what summarization took out of the context window "
        "(<session>.md, its media under media/) and oversized human messages "
        "(<uuid>.md), which the model only sees as a preview naming the file"),
    BuiltinRule(
        "blobs/*",
        "Deep Agents' offloaded media (offload_binary_content): a human message's "
        "images and files, kept in the conversation as a digest only"),
)


class RuleError(ValueError):
    """A rule is wrong; the message names it and says how."""


@dataclass(frozen=True, slots=True)
class Rule:
    index: int  # 1-based, as `vfsd status` lists them
    path: str
    regex: Glob  # what `path` matches (`Glob.fullmatch`)
    max_age_steps: int | None = None
    done_retention_steps: int | None = None
    pin: bool | None = None  # None: not given (the same as false)
    #: why vfsd has this rule, for a built-in one (None: the user's)
    builtin: str | None = None

    def as_dict(self) -> dict:
        out: dict = {"path": self.path}
        if self.max_age_steps is not None:
            out["max_age_steps"] = self.max_age_steps
        if self.done_retention_steps is not None:
            out["done_retention_steps"] = self.done_retention_steps
        if self.pin is not None:
            out["pin"] = self.pin
        if self.builtin is not None:
            out["builtin"] = True
            out["why"] = self.builtin
        return out

    def describe(self) -> str:
        return f"{'built-in ' if self.builtin else ''}rule {self.index} ({self.path})"


#: a `*` inside a name, and a `**` name
_STAR, _NAMES = object(), object()


class Glob:
    """A compiled path glob (see the module docstring)."""

    __slots__ = ("names", "first")

    def __init__(self, names: list, first: str | None = None) -> None:
        # Each item: _NAMES, or a name's tokens (a character, "?", a class
        # regex of one character, or _STAR).
        self.names = names
        # The first name when it is plain text (no wildcard): a path whose
        # first name differs cannot match, whatever follows.
        self.first = first

    def fullmatch(self, path: str) -> bool:
        """True if the whole of `path` (relative, "/"-separated) matches."""
        return _walk(self.names, path.split("/"), _NAMES, _name_matches)


def _walk(pattern: list, items, star, one) -> bool:
    """Does `pattern` match all of `items`? `star` (in `pattern`) takes any
    number of items, anything else exactly one for which `one(token, item)`
    holds. Only the last star's start is remembered (a later star never needs
    an earlier one to take more), so the cost is at most len(items) x
    len(pattern) calls of `one`."""
    p = i = 0
    star_p, star_i = -1, 0
    while i < len(items):
        if p < len(pattern) and pattern[p] is star:
            star_p, star_i = p, i
            p += 1
        elif p < len(pattern) and one(pattern[p], items[i]):
            p += 1
            i += 1
        elif star_p >= 0:
            star_i += 1
            p, i = star_p + 1, star_i
        else:
            return False
    while p < len(pattern) and pattern[p] is star:
        p += 1
    return p == len(pattern)


def _char_matches(token, c: str) -> bool:
    if token.__class__ is str:  # "?" (any character) or the character itself
        return token == "?" or token == c
    return token.fullmatch(c) is not None  # a class


def _name_matches(tokens, name: str) -> bool:
    if tokens.__class__ is not list:  # a name of few stars, as a regex (see `_name_tokens`)
        return tokens.fullmatch(name) is not None
    return _walk(tokens, name, _STAR, _char_matches)


def compile_glob(glob: str) -> Glob:
    """The matcher of a path glob (see the module docstring); ValueError if malformed."""
    if not glob or glob.strip("/") == "":
        raise ValueError("the glob is empty")
    if "\0" in glob:
        raise ValueError("the glob holds a NUL byte")
    glob = glob.strip("/") if glob != "/" else glob
    names = glob.split("/")
    if any(n in ("", ".", "..") for n in names):
        raise ValueError("the glob has an empty, '.' or '..' name")
    out: list = []
    for name in names:
        if name == "**":
            if not out or out[-1] is not _NAMES:  # `**/**` is one `**`
                out.append(_NAMES)
            continue
        if "**" in name:
            raise ValueError(f"'**' must be a whole name, got {name!r}")
        out.append(_name_tokens(name))
    plain = not any(c in names[0] for c in "*?[")
    return Glob(out, names[0] if plain else None)


#: a name with at most this many stars is matched by a regex: on a name of at
#: most 255 characters its backtracking is bounded (255^2 steps), and it is
#: many times faster than the walk in Python
REGEX_STARS = 2


def _name_tokens(name: str):
    """A name's tokens (see `Glob`), or a regex of them when that is safe."""
    tokens = _tokens(name)
    if sum(t is _STAR for t in tokens) > REGEX_STARS:
        return tokens
    parts = []
    for t in tokens:
        if t is _STAR:
            parts.append(".*")
        elif t.__class__ is str:
            parts.append("." if t == "?" else re.escape(t))
        else:
            parts.append(t.pattern)
    return re.compile("".join(parts), re.DOTALL)


def _tokens(name: str) -> list:
    out: list = []
    i = 0
    while i < len(name):
        c = name[i]
        if c == "*":
            if not out or out[-1] is not _STAR:
                out.append(_STAR)
        elif c == "?":
            out.append("?")
        elif c == "[":
            end = name.find("]", i + 2 if name[i + 1:i + 2] in ("!", "^") else i + 1)
            if end < 0:
                raise ValueError(f"unclosed '[' in {name!r}")
            body = name[i + 1:end]
            if body[:1] in ("!", "^"):
                body = "^" + body[1:]
            try:
                out.append(re.compile("[" + body.replace("\\", "\\\\") + "]", re.DOTALL))
            except re.error as exc:
                raise ValueError(f"bad class [{name[i + 1:end]}]: {exc}") from None
            i = end
        else:
            out.append(c)
        i += 1
    return out


def parse_rules(raw) -> list[Rule]:
    """Rules from a list of tables (TOML, JSON); RuleError naming the first bad one."""
    if raw is None:
        return []
    if not isinstance(raw, list | tuple):
        raise RuleError(f"eviction_rules must be a list of tables such as "
                        f"[{{path = \"tool_outputs/**\", max_age_steps = 5}}], got {raw!r}")
    if len(raw) > MAX_RULES:
        raise RuleError(f"eviction_rules: at most {MAX_RULES} rules, got {len(raw)}")
    return [_parse_rule(i + 1, r) for i, r in enumerate(raw)]


def _parse_rule(index: int, raw) -> Rule:
    what = f"eviction rule {index}"
    if not isinstance(raw, dict):
        raise RuleError(f"{what} must be a table such as {{path = \"src/**\", pin = true}}, "
                        f"got {raw!r}")
    if isinstance(raw.get("path"), str):
        what += f" ({raw['path']!r})"
    unknown = sorted(set(raw) - set(RULE_KEYS))
    if unknown:
        raise RuleError(f"{what}: unknown key(s) {', '.join(map(repr, unknown))}; "
                        f"a rule takes {', '.join(RULE_KEYS)}")
    if "path" not in raw:
        raise RuleError(f"{what}: no 'path' (a glob such as \"tool_outputs/**\")")
    for key, want in RULE_KEYS.items():
        if key not in raw:
            continue
        value = raw[key]
        ok = isinstance(value, want) and (want is bool or not isinstance(value, bool))
        if not ok or (want is int and value < 0):
            kind = {str: "a glob (text)", int: "a non-negative integer",
                    bool: "true or false"}[want]
            raise RuleError(f"{what}: {key} must be {kind}, got {value!r}")
    if len(raw) == 1:
        raise RuleError(f"{what}: sets nothing; give max_age_steps, done_retention_steps "
                        "or pin (pin = false: the global limits, ahead of a built-in rule)")
    try:
        regex = compile_glob(raw["path"])
    except ValueError as exc:
        raise RuleError(f"{what}: bad glob: {exc}") from None
    return Rule(index, raw["path"], regex, raw.get("max_age_steps"),
                raw.get("done_retention_steps"), raw.get("pin"))


def builtin_rules(first_index: int) -> list[Rule]:
    """The built-in rules, numbered from `first_index` (after the user's)."""
    return [Rule(first_index + i, b.path, compile_glob(b.path), pin=b.pin, builtin=b.why)
            for i, b in enumerate(BUILTIN_RULES)]


def volume_rules(raw, builtins: bool = True) -> list[Rule]:
    """A volume's rules in the order they are matched: the user's (`raw`,
    see `parse_rules`), then the built-in ones unless `builtins` is false."""
    rules = parse_rules(raw)
    return rules + (builtin_rules(len(rules) + 1) if builtins else [])


class RuleSet:
    """The compiled rules of a volume, matched first to last."""

    #: first names whose candidate rules are remembered (a tree has few at its top)
    HEADS_KEPT = 1024

    def __init__(self, rules: list[Rule]) -> None:
        self.rules = rules
        self._by_head: dict[str, list[Rule]] = {}

    def __bool__(self) -> bool:
        return bool(self.rules)

    def _for_head(self, head: str) -> list[Rule]:
        """The rules a path whose first name is `head` can match, in order:
        a glob that starts with a plain name (`src/**`, the built-in ones)
        only for that name, so most candidates meet only the globs that
        start with a wildcard."""
        got = self._by_head.get(head)
        if got is None:
            got = [r for r in self.rules if r.regex.first in (None, head)]
            if len(self._by_head) < self.HEADS_KEPT:
                self._by_head[head] = got
        return got

    def match(self, path: str) -> Rule | None:
        for rule in self._for_head(path.partition("/")[0]):
            if rule.regex.fullmatch(path):
                return rule
        return None

    def lowest(self, key: str, default: int) -> int:
        """The smallest value of `key` any file can have (the scan's bound)."""
        values = [getattr(r, key) for r in self.rules if getattr(r, key) is not None]
        return min([default, *values])

    def as_list(self) -> list[dict]:
        return [r.as_dict() for r in self.rules]
