"""No test module imports another test module or a conftest.

Shared helpers live in helper modules named for what they hold (e.g.
``tests/unit/checkpoint_fixtures.py``): a test importing another test drags that module's
tests into its own namespace, where pytest collects them twice, and couples two files that
look independent. Fixtures stay in conftest, which pytest loads itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent


def _is_test_module(name: str) -> bool:
    """A dotted module name whose last part is a test module or a conftest."""
    last = name.rsplit(".", 1)[-1]
    return last.startswith("test_") or last == "conftest"


def forbidden_imports(source: str) -> list[str]:
    """The test modules and conftests that ``source`` imports, as written."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if _is_test_module(alias.name)]
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            if node.module and _is_test_module(node.module):
                found.append(module)
            else:  # ``from . import test_x`` / ``from tests.unit import conftest``
                found += [
                    f"{module}.{alias.name}" if node.module else module + alias.name
                    for alias in node.names
                    if _is_test_module(alias.name)
                ]
    return found


def _modules() -> list[Path]:
    paths = set(TESTS.rglob("test_*.py")) | set(TESTS.rglob("conftest.py"))
    return sorted(paths)


def test_no_test_module_imports_a_test_module_or_conftest() -> None:
    offenders = {
        str(path.relative_to(TESTS.parent)): imported
        for path in _modules()
        if (imported := forbidden_imports(path.read_text()))
    }
    assert offenders == {}, (
        "test modules import test modules or conftests (move what they share into a helper "
        f"module): {offenders}"
    )


def test_the_check_sees_every_form_of_import() -> None:
    source = (
        "import tests.unit.test_lease\n"
        "from tests.e2e.conftest import Space\n"
        "from .test_rescale import EPOCH\n"
        "from . import conftest\n"
        "from tests.unit import test_lease as lease\n"
        "from tests.unit.checkpoint_fixtures import make_meta\n"
        "import tests.helpers\n"
    )
    assert forbidden_imports(source) == [
        "tests.unit.test_lease",
        "tests.e2e.conftest",
        ".test_rescale",
        ".conftest",
        "tests.unit.test_lease",
    ]
    assert len(_modules()) > 50  # the glob sees the suite
