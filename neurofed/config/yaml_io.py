"""YAML read safely: no duplicate keys, and bounds on size, depth and aliases, so a
config (or a run's config.yaml from someone else) cannot exhaust memory."""

from __future__ import annotations

import re

import yaml

from neurofed.config.checks import ConfigError


class _Loader(yaml.SafeLoader):
    """YAML 1.1 reads ``1e-3`` as a string; configs mean a float."""


def _mapping_without_duplicates(loader, node, deep=False):
    """A YAML mapping, refusing a key given twice (YAML would silently keep the last)."""
    loader.flatten_mapping(node)
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} given twice (line {key_node.start_mark.line + 1}); "
                f"YAML would silently keep only the last", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep)


# Bounds on what a config may hold: configs are a few kB, three levels deep. Without them
# a YAML alias bomb (aliases of aliases: 9^9 values from 1 kB) or a 10,000-deep nesting
# hangs or overflows the stack of whatever walks the values (validation, repr, dump).
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
    list("-+0123456789."),
)

MAX_CONFIG_BYTES = 1 << 20


MAX_VALUES = 100_000  # values after expanding aliases


MAX_DEPTH = 64


def _node_bounds(root) -> str | None:
    """What is wrong with a composed YAML node graph (aliases counted each time they are used), or None."""
    sizes: dict[int, int] = {}
    shared = False  # a node reached twice: an alias
    # iterative post-order walk: an alias is the same node object reached twice, counted once per use
    stack = [(root, 1, False)]
    while stack:
        node, depth, done = stack.pop()
        if depth > MAX_DEPTH:
            return f"nested more than {MAX_DEPTH} levels deep"
        children = [c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode) else \
            node.value if isinstance(node, yaml.SequenceNode) else []
        if done:
            sizes[id(node)] = 1 + sum(sizes[id(c)] for c in children)
            if sizes[id(node)] > MAX_VALUES:
                return f"holds more than {MAX_VALUES:,} values" + \
                    (" once its YAML aliases are expanded" if shared else "")
        elif id(node) in sizes:
            shared = True
        else:
            stack.append((node, depth, True))
            stack.extend((c, depth + 1, False) for c in children)
    return None


def yaml_load(text: str, what: str = "YAML"):
    """Parse ``text`` (config, sweep or ``--set`` value) with the config loader, within the
    bounds above; ConfigError naming ``what`` otherwise."""
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{what}: {len(text):,} characters; a config holds at most {MAX_CONFIG_BYTES:,}")
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        problem = _node_bounds(node)
        if problem:
            raise ConfigError(f"{what}: {problem}; configs are a few levels of keys and values")
        return loader.construct_document(node)
    except RecursionError:
        raise ConfigError(f"{what}: nested more than {MAX_DEPTH} levels deep; configs are a few levels of "
                          f"keys and values") from None
    finally:
        loader.dispose()
