# Accord: two commands on a fresh machine.
#   make demo   installs what is missing, builds, and runs the main job on its embedded default
#   make test   runs every test
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: setup build demo test fmt clippy

# A Rust toolchain of 1.85 or newer is needed; rustup installs one where the machine has none.
setup:
	@command -v $(CARGO) >/dev/null || { echo "no cargo found: installing a Rust toolchain with rustup"; curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal; }
	@$(CARGO) --version

build: setup
	$(CARGO) build --release --workspace

demo: build
	./target/release/accord bench

test: setup
	$(CARGO) test --release --workspace
	scripts/python-test.sh

fmt:
	$(CARGO) fmt --all

clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings
