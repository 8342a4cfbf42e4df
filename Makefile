# Two commands for a fresh machine (Python 3.11+, Java 17+):
#   make demo   install into .venv and run the quickstart job on the embedded local root
#   make test   install into .venv and run the whole test suite
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
export PYSPARK_PYTHON := $(abspath $(BIN)/python)
export PYSPARK_DRIVER_PYTHON := $(abspath $(BIN)/python)
SPARK_SUBMIT := $(BIN)/spark-submit --properties-file conf/spark-defaults.conf \
	--driver-java-options "-Dlog4j2.configurationFile=file:$(abspath conf/log4j2.properties)"

.PHONY: install demo test lint bench pipeline clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]' --config-settings editable_mode=compat
	rm -f $(VENV)/.installed-*; touch $(STAMP)

install: $(STAMP)

demo: install
	$(SPARK_SUBMIT) examples/quickstart.py

test: install
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .

bench: install
	$(BIN)/python bench/append.py
	$(BIN)/python bench/read.py

clean:
	rm -rf pulsartx-data spark-warehouse .pytest_cache
