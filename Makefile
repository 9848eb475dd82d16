# The README's test command: every Rust test, then the `specmla` Python package built
# from the core (maturin, an abi3 wheel) into a private virtualenv and its pytest suite.
.PHONY: test
VENV := target/pyvenv

test:
	cargo test --workspace
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q "maturin>=1.5,<2" pytest numpy
	VIRTUAL_ENV=$(abspath $(VENV)) $(VENV)/bin/maturin develop -q -m python/Cargo.toml
	$(VENV)/bin/pytest -q python/tests
