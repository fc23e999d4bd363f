"""Helpers the tests share: the rank harness (`helpers.ranks`) and the `leo` command
(`helpers.cli`). Fixtures stay in tests/conftest.py."""
