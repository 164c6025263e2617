"""What several test files share: oracles, small models and fixtures (imported as `support.*`).

pytest puts `tests/` on the import path (its conftest.py), so a test anywhere below imports
`from support.transformers_oracles import hf_dict`. Fixtures are registered as a plugin in
`tests/conftest.py` (`pytest_plugins`).
"""
