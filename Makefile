# Two commands for a fresh machine (Python 3.11+, Java 17+):
#   make demo   install into .venv and run the quickstart job on the embedded local root
#   make test   install into .venv and run the whole test suite
#   make reliability   the reliability suites at full scale (docs/reliability.md), ~30-40 min
#   make dist   build the wheel into dist/ (pulsartx is not on PyPI)
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP_ID := $(shell cksum < pyproject.toml | cut -d' ' -f1)
RUNTIME := $(VENV)/.installed-runtime-$(STAMP_ID)
DEV := $(VENV)/.installed-dev-$(STAMP_ID)
export PYSPARK_PYTHON := $(abspath $(BIN)/python)
export PYSPARK_DRIVER_PYTHON := $(abspath $(BIN)/python)
SPARK_SUBMIT := $(BIN)/spark-submit --properties-file conf/spark-defaults.conf \
	--driver-java-options "-Dlog4j2.configurationFile=file:$(abspath conf/log4j2.properties)"

.PHONY: install demo test reliability lint bench pipeline dist clean

# What the demo and the pipeline need: pulsartx and its runtime dependencies (pyspark alone is ~320 MB).
$(RUNTIME): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@echo ">> installing pulsartx into $(VENV) (pyspark, pyarrow, deltalake: 1-3 minutes on a fresh machine)"
	$(BIN)/python -m pip install --upgrade --progress-bar on pip
	$(BIN)/python -m pip install --progress-bar on -e .
	rm -f $(VENV)/.installed-runtime-*; touch $@

# The tests add pytest, hypothesis, chispa, ruff, s3fs and moto.
$(DEV): $(RUNTIME)
	@echo ">> installing the test tools into $(VENV)"
	$(BIN)/python -m pip install --progress-bar on -e '.[dev]'
	rm -f $(VENV)/.installed-dev-*; touch $@

install: $(DEV)

demo: $(RUNTIME)
	$(SPARK_SUBMIT) examples/quickstart.py

# The README's streaming example: seeds a topic, then pulsartx -> transform -> pulsartx, exactly once.
pipeline: $(RUNTIME)
	$(SPARK_SUBMIT) examples/exactly_once_pipeline.py --seed 10000 --available-now

# Two pytest workers, each with its own SparkSession (and its own Ceph RGW for the rgw tests); a
# test file stays on one worker. PYTEST_WORKERS=0 runs everything in one process.
PYTEST_WORKERS ?= 2
test: $(DEV)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The reliability suites at full scale: crash matrix 10 points x 20 seeds on local disk and on Ceph RGW,
# the 9-process soak for 5 minutes on both, the storage-fault matrix (every fault class, 45 s each, on
# both), storage faults after every marker, 10x fuzzing and model checking, the core modules on RGW
# including the slow ones. `make test` runs the same suites at a smaller scale.
RELIABILITY_ENV := PULSARTX_CRASH_SEEDS=20 PULSARTX_CRASH_SEEDS_RGW=20 PULSARTX_SOAK_SECONDS=300 \
	PULSARTX_SOAK_STORAGE=all PULSARTX_TEST_RGW_FULL=1 PULSARTX_FUZZ_SCALE=10 PULSARTX_REPORT_COUNTS=1 \
	PULSARTX_FAULT_MATRIX=all
reliability: $(DEV)
	scripts/ceph-rgw.sh install
	$(RELIABILITY_ENV) $(BIN)/python -m pytest -q -s -p no:cacheprovider tests/reliability
	$(RELIABILITY_ENV) PULSARTX_TEST_STORAGE=rgw $(BIN)/python -m pytest -q -p no:cacheprovider \
		tests/test_transactions.py tests/test_coordinator.py tests/test_pending_ack.py tests/test_partition_log.py \
		tests/test_fencing.py tests/test_client.py tests/test_consumer.py tests/test_admin_subscriptions.py

lint: $(DEV)
	$(BIN)/ruff check .

bench: $(DEV)
	$(BIN)/python bench/append.py
	$(BIN)/python bench/read.py
	$(BIN)/python bench/scale.py

# The wheel (dist/pulsartx-*.whl) to install elsewhere: pip install 'dist/pulsartx-0.1.0-py3-none-any.whl[s3]'.
dist: $(DEV)
	rm -rf dist
	$(BIN)/python -m build --wheel --outdir dist

clean:
	rm -rf pulsartx-data spark-warehouse .pytest_cache build dist
