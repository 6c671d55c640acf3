#!/usr/bin/env python3
"""Tests of scripts/function_length.py on layouts clang-format produces and on a tree over the limit."""

import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import function_length  # noqa: E402


def measured(source):
    return [(name, last - first + 1)
            for name, first, last in function_length.functions(function_length.strip_source(source))]


class ScannerTest(unittest.TestCase):

    def test_counts_from_the_named_line_to_the_closing_brace(self):
        self.assertEqual(measured("int F(int a) {\n  return a;\n}\n"), [("F", 3)])

    def test_wrapped_signature_starts_at_the_name(self):
        src = "template <typename T>\nStatusOr<std::vector<T>> Load(const std::string& path,\n" \
              "                                  int limit) const {\n  return {};\n}\n"
        self.assertEqual(measured(src), [("Load", 4)])

    def test_braces_in_comments_and_literals_do_not_count(self):
        src = ('void F() {\n  // }\n  /* { } */\n  const char* s = "}";\n  char c = \'}\';\n'
               '  auto r = R"x(})x";\n}\nvoid G() {}\n')
        self.assertEqual(measured(src), [("F", 7), ("G", 1)])

    def test_initializer_list_with_braced_members(self):
        src = "Foo::Foo(int a)\n    : a_(a),\n      b_{1, 2} {\n  Init();\n}\n"
        self.assertEqual(measured(src), [("Foo", 5)])

    def test_members_in_namespaces_and_classes(self):
        src = "namespace capsule {\nnamespace {\nclass A {\n public:\n  int Get() const { return 1; }\n" \
              "  enum class E { kA, kB };\n};\n}  // namespace\nextern \"C\" {\nvoid C() {}\n}\n}\n"
        self.assertEqual(measured(src), [("Get", 1), ("C", 1)])

    def test_initializers_and_lambdas_are_not_functions(self):
        src = "const int kTable[] = {1, 2};\nauto kF = [](int a) {\n  return a;\n};\n" \
              "void F() {\n  auto g = [&]() {\n    return 1;\n  };\n}\n"
        self.assertEqual(measured(src), [("F", 5)])

    def test_trailing_return_noexcept_and_macros(self):
        src = "auto F() -> int {\n  return 1;\n}\nA& A::operator=(A&& o) noexcept {\n  return *this;\n}\n" \
              "PYBIND11_MODULE(_capsule, m) {\n  m.doc() = \"x\";\n}\n"
        self.assertEqual(measured(src), [("F", 3), ("operator=", 3), ("PYBIND11_MODULE", 3)])

    def test_preprocessor_lines_are_ignored(self):
        src = "#include <map>\n#define OPEN(x) \\\n  {\nvoid F() {\n#if X\n  G();\n#endif\n}\n"
        self.assertEqual(measured(src), [("F", 5)])


class TreeTest(unittest.TestCase):

    def run_on(self, files):
        with tempfile.TemporaryDirectory() as root:
            for rel, text in files.items():
                os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
                with open(os.path.join(root, rel), "w") as f:
                    f.write(text)
            script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "function_length.py")
            return subprocess.run([sys.executable, script, "--root", root, "--limit", "5"],
                                  capture_output=True, text=True)

    def test_a_long_library_function_fails(self):
        result = self.run_on({"lib/a.cc": "void Long() {\n" + "  x();\n" * 6 + "}\n"})
        self.assertEqual(result.returncode, 1)
        self.assertIn("lib/a.cc:1: Long 8 lines", result.stdout)

    def test_tests_samples_and_bench_are_not_read(self):
        body = "void Long() {\n" + "  x();\n" * 6 + "}\n"
        result = self.run_on({"tests/a.cc": body, "samples/a.cc": body, "bench/a.cc": body,
                              "lib/short.cc": "void S() {}\n"})
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertEqual(result.stdout, "")


if __name__ == "__main__":
    unittest.main()
