"""MonitorOptions (capture/monitor.h) is the one declaration of the Monitor's options: the binding's
table (_capsule.MONITOR_OPTIONS) names a keyword for each of its fields, the engine takes each
keyword with a value of the field's type, and capsule.Monitor takes and documents what the table
names.

Run by ctest (python_tests) with PYTHONPATH holding build/python.
"""
import pathlib
import re

import pytest

import capsule
from capsule import _capsule

MONITOR_H = pathlib.Path(__file__).resolve().parents[2] / "capture" / "monitor.h"


def header_fields():
    """(type, name, default or None) for each MonitorOptions field, in declaration order."""
    text = MONITOR_H.read_text()
    body = re.search(r"^struct MonitorOptions \{\n(.*?)^\};", text, re.S | re.M).group(1)
    body = re.sub(r"//[^\n]*", "", body)
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    fields = []
    for statement in body.split(";"):
        statement = " ".join(statement.split())
        if not statement:
            continue
        decl, _, default = statement.partition("=")
        m = re.match(r"(.+?)\s*\b(\w+)$", decl.strip())
        assert m, f"cannot read a MonitorOptions field from {statement!r}"
        fields.append((m.group(1), m.group(2), default.strip() or None))
    return fields


def python_value(cpp_type, default):
    """A Python value of the field's type: its C++ default where Python reads it the same."""
    if cpp_type == "bool":
        return default != "false"
    if cpp_type in ("int", "int64_t"):
        return int(default) if default else 0
    if cpp_type == "uint64_t":
        return 256 << 20
    if cpp_type == "double":
        return float(default) if default else 0.0
    if cpp_type == "std::string":
        return default.strip('"') if default else ""
    if cpp_type == "WeightPolicy":
        return "all"
    if cpp_type == "SpikeRule":
        return {"window": 50}
    if cpp_type.startswith("std::vector"):
        return []
    if cpp_type.startswith("std::map"):
        return {}
    if cpp_type.startswith("std::function"):
        return lambda line: None
    raise AssertionError(f"no Python value for a MonitorOptions field of type {cpp_type}")


def test_the_header_is_read():
    names = [name for _, name, _ in header_fields()]
    assert "capsule_dir" in names and "log_sink" in names and len(names) > 20


def test_the_binding_names_every_monitor_options_field_and_no_other():
    header = [name for _, name, _ in header_fields()]
    table = [field for _, field in _capsule.MONITOR_OPTIONS]
    missing = [f for f in header if f not in table]
    unknown = [f for f in table if f not in header]
    assert not missing, f"MonitorOptions fields without a Python keyword: {missing}"
    assert not unknown, f"Python keywords for fields MonitorOptions lacks: {unknown}"
    assert table == header, "the table lists the fields in MonitorOptions' order"


def test_the_monitor_takes_every_keyword_with_a_value_of_its_field_type(tmp_path):
    keyword = {field: kw for kw, field in _capsule.MONITOR_OPTIONS}
    for cpp_type, name, default in header_fields():
        if name == "signing_key_path":
            continue  # a key file is read when the first capsule is signed: tested end to end
        value = python_value(cpp_type, default)
        if name == "capsule_dir":
            value = str(tmp_path / "caps")
        capsule.Monitor(**{keyword[name]: value})


def test_capsule_monitor_takes_and_documents_the_binding_keywords():
    keywords = tuple(kw for kw, _ in _capsule.MONITOR_OPTIONS)
    assert capsule.Monitor.OPTIONS == keywords
    for kw in keywords:
        assert re.search(rf"\b{kw}\b", capsule.Monitor.__doc__), kw
    with pytest.raises(TypeError, match="unknown option 'background_wait'"):
        capsule.Monitor(background_wait=1)
