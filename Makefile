# Accord: two commands on a fresh machine.
#   make demo   installs what is missing, builds, and runs the main job on its embedded default
#   make test   runs every test
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: setup build demo test fmt clippy

setup:
	@command -v $(CARGO) >/dev/null || { echo "installing rustup toolchain"; curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal; }

build: setup
	$(CARGO) build --release --workspace

demo: build
	./target/release/accord sim loss-sweep

test: setup
	$(CARGO) test --release --workspace

fmt:
	$(CARGO) fmt --all

clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings
