"""What the tests share: bounded waits on a condition (``wait_until``), never sleep-and-hope.

Importable as ``support`` from every test module: tests/conftest.py is a root conftest without a
package, so pytest puts tests/ on ``sys.path`` before any test module is imported.
"""

from support.wait import WaitTimeout, wait_until

__all__ = ["WaitTimeout", "wait_until"]
