# apns-fleet — the two commands a new user runs:
#   make demo   run the main job on embedded defaults
#   make test   build and run the test suite
# Both install missing system packages first (Debian: apt-get, as root or through sudo).

SHELL := /bin/bash
SWIFT ?= swift

# Libraries the build links against, and the tools the tests drive the product with.
BUILD_PACKAGES := librdkafka-dev libnghttp2-dev libjemalloc-dev libssl-dev pkg-config
TEST_PACKAGES  := nghttp2-client kcat openssl python3-aioapns python3-h2 python3-jsonschema python3-yaml

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all build release deps test-deps test demo clean config-reference help

all: build

help:
	@echo "make demo    run the demo on embedded Kafka and the APNs simulator"
	@echo "make test    build and run the tests (installs missing system packages)"
	@echo "make build   debug build;  make release  release build"
	@echo "make soak    the reliability suites at soak size"
	@echo "make sanitize  APNsCore's tests under TSan and ASan;  make fuzz  libFuzzer over the decoders"
	@echo "make config-reference  regenerate docs/configuration.md"

# Installs only what is absent, so a machine that has everything never touches apt. A package
# removed but not purged still has a dpkg record: only "install ok installed" counts.
define install_missing
	@missing=""; for p in $(1); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		if [ -n "$(SUDO)" ] && ! command -v sudo >/dev/null; then echo "error: missing packages:$$missing; run make as root, or install sudo, to install them"; exit 1; fi; \
		echo "installing:$$missing"; \
		$(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
endef

# Swift is checked first: without it, installing the packages would be for nothing.
deps:
	@command -v $(SWIFT) >/dev/null || { echo "error: $(SWIFT) is not on PATH; install Swift 6.2 or later (tested with 6.3.1, swift.org/install) or pass SWIFT=/path/to/swift"; exit 1; }
	$(call install_missing,$(BUILD_PACKAGES))

test-deps: deps
	$(call install_missing,$(TEST_PACKAGES))
	@# The tests run Debian's Python (/usr/bin/python3), which the packages above serve.
	@/usr/bin/python3 -c 'import jsonschema, yaml, h2' || { echo "error: /usr/bin/python3 cannot import jsonschema, yaml and h2 although python3-jsonschema, python3-yaml and python3-h2 are installed"; exit 1; }

build: deps
	$(SWIFT) build

release: deps
	$(SWIFT) build -c release --product apns-fleet

test: test-deps
	$(SWIFT) build --build-tests
	/usr/bin/python3 scripts/check_packaging.py
	@# Reruns once only if librdkafka's mock cluster aborted on its port race (see the script).
	SWIFT="$(SWIFT)" scripts/swift-test.sh

# The whole fleet on this machine: embedded Kafka, the APNs simulator (TLS), a push worker and
# the feedback worker, 100,000 jobs, a live progress bar and a summary. DEMO_ARGS passes flags,
# e.g. make demo DEMO_ARGS="--jobs 20000 --workers 2".
demo: release
	@# The demo points at kcat to look at the topics while it runs.
	$(call install_missing,kcat)
	.build/release/apns-fleet demo $(DEMO_ARGS)

# The reliability suites (worker kills, Kafka and APNs faults) at soak size: more runs, jobs and kills.
.PHONY: soak
soak: test-deps
	$(SWIFT) build --build-tests
	APNS_FLEET_SOAK=1 $(SWIFT) test --skip-build --filter ReliabilityTests

# APNsCore's unit tests under ThreadSanitizer and AddressSanitizer, plus the fuzz seeds replayed
# through the fuzz checks. Builds only Tests/Sanitized (APNsCore, no other dependency), about a
# minute per sanitizer from cold. SANITIZERS="address" runs one.
.PHONY: sanitize
sanitize:
	SWIFT=$(SWIFT) scripts/sanitize.sh

# libFuzzer over the job decoder (both encodings, via JobIntake) and the legacy PDU parsers,
# FUZZ_SECONDS in all, from the seeds in Tests/Corpus/fuzz-seeds. A crash, hang or broken
# property fails it and leaves the input in Tests/Sanitized/.build-fuzz/artifacts/.
FUZZ_SECONDS ?= 60
.PHONY: fuzz
fuzz:
	SWIFT=$(SWIFT) FUZZ_SECONDS=$(FUZZ_SECONDS) scripts/fuzz.sh

# Regenerates docs/configuration.md from the configuration code.
config-reference:
	python3 scripts/gen_config_reference.py

clean:
	rm -rf .build
