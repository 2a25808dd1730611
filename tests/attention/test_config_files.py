"""``configs/attention/<name>.yaml`` against the backends' config dataclasses.

The dataclass is the one source of every default: each YAML file repeats them for readers, and these checks keep
the copies equal. The first line's ``Cost <formula>.`` is generated from the class (tests/test_docs.py).
"""
from __future__ import annotations

import dataclasses
import re

import pytest
import yaml
from conftest import ATTENTION_NAMES, CONFIGS

from vitzoo.attention import ATTENTION

FILES = {name: CONFIGS / "attention" / f"{name}.yaml" for name in ATTENTION_NAMES}


def yaml_options(name: str) -> dict:
    """The options of ``configs/attention/<name>.yaml`` (without ``name``)."""
    data = yaml.safe_load(FILES[name].read_text()) or {}
    assert data.pop("name", name) == name
    return data


@pytest.mark.parametrize("name", ATTENTION_NAMES)
def test_yaml_defaults_equal_the_dataclass_defaults(name):
    config_cls = ATTENTION.get(name)[1]
    defaults = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                for f in dataclasses.fields(config_cls)}
    options = yaml_options(name)
    assert set(options) == set(defaults), f"{FILES[name].name}: keys differ from {config_cls.__name__}"
    for key, value in options.items():
        want = list(defaults[key]) if isinstance(defaults[key], tuple) else defaults[key]
        assert value == want, f"{FILES[name].name}: {key}: {value!r} but {config_cls.__name__} says {want!r}"


@pytest.mark.parametrize("name", ATTENTION_NAMES)
def test_every_yaml_option_has_a_comment(name):
    """Each option says what it does: ``key: value  # ...``, or a comment on the line above it."""
    lines = FILES[name].read_text().splitlines()
    missing = [ln for i, ln in enumerate(lines) if re.match(r"^\w+:", ln) and not ln.startswith("name:")
               and "#" not in ln and not (i and lines[i - 1].startswith("#"))]
    assert not missing, f"{FILES[name].name}: options without a comment: {missing}"
