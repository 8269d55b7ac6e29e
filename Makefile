# tiergate: build, generate, lint and test. `make help` lists the targets.
#
# Every target that needs a tool depends on it through hack/tools.sh, which
# builds into bin/ and skips work when the binaries are current.

SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

export GOWORK := off
# The patched Go release (the machines ship an older one with GOTOOLCHAIN=local);
# the go command fetches it from the module proxy once. .ci/run, the Dockerfile
# and the README name the same version.
export GOTOOLCHAIN := go1.26.10

BIN            := $(CURDIR)/bin
CONTROLLER_GEN := $(BIN)/controller-gen
GOLANGCI_LINT  := $(BIN)/golangci-lint

# Where generated files go. `make verify` points these at a temporary
# directory and compares the result with the tree.
CRD_DIR       ?= config/crd/bases
CHART_CRD_DIR ?= charts/tiergate/crds
RBAC_DIR      ?= config/rbac
DEEPCOPY_DIR  ?=

# Unit and integration tests share one run. -race because the dispatcher is
# all about concurrency; the timeout is per test binary.
GO_TEST_FLAGS ?= -race -count=1 -timeout=30m
# Debian packages the suites need (redis-server for fleet-mode tests).
TEST_DEB_PACKAGES := redis-server prometheus
# What the suites, verify and vulncheck need from hack/tools.sh.
# golangci-lint is only make lint's: building it from cold caches takes
# minutes that make test does not need.
TEST_TOOLS := k8s kwok helm controller-gen govulncheck vulndb keda

##@ General

.PHONY: help
help: ## Show this help
	@awk 'BEGIN { FS = ":.*##"; printf "Usage: make <target>\n" } \
		/^[a-zA-Z0-9_-]+:.*##/ { printf "  %-12s %s\n", $$1, $$2 } \
		/^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)

.PHONY: tools
tools: ## Build bin/k8s/{kube-apiserver,etcd,kubectl,kube-controller-manager,kube-scheduler,kwok}, install bin/{helm,controller-gen,golangci-lint,govulncheck,indexdb}, build bin/vulndb (skips when current)
	hack/tools.sh

##@ Development

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# The release binary: static, trimmed, version-stamped. make image and the
# Dockerfile build it with the same flags.
BUILD_LDFLAGS := -s -w -X main.version=$(VERSION)

.PHONY: build
build: ## Build bin/tiergate, the static version-stamped binary the image ships
	CGO_ENABLED=0 go build -trimpath -ldflags "$(BUILD_LDFLAGS)" -o $(BIN)/tiergate .

.PHONY: vulncheck
vulncheck: build ## govulncheck the module and bin/tiergate against an offline database built from golang.org/x/vulndb
	hack/vulncheck.sh

.PHONY: manifests
manifests: ## Generate the CRDs (config/crd/bases and the chart's crds/) and RBAC (config/rbac) from markers
	hack/tools.sh controller-gen
	mkdir -p $(CRD_DIR) $(CHART_CRD_DIR) $(RBAC_DIR)
	@# Generate aside first, so a failed run leaves the old CRDs in place.
	tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:dir=$$tmp && \
	rm -f $(CRD_DIR)/tiergate.dev_*.yaml $(CHART_CRD_DIR)/tiergate.dev_*.yaml && \
	cp $$tmp/tiergate.dev_*.yaml $(CRD_DIR)/ && \
	cp $$tmp/tiergate.dev_*.yaml $(CHART_CRD_DIR)/
	$(CONTROLLER_GEN) rbac:roleName=tiergate-controller paths=./... output:rbac:dir=$(RBAC_DIR)

.PHONY: generate
generate: ## Generate the deepcopy methods of api/v1alpha1
	hack/tools.sh controller-gen
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/... $(if $(DEEPCOPY_DIR),output:object:dir=$(DEEPCOPY_DIR))

.PHONY: fmt
fmt: ## Format the Go code with gofmt
	git ls-files --cached --others --exclude-standard '*.go' | \
		while read -r f; do if [[ -f $$f ]]; then echo "$$f"; fi; done | xargs -r gofmt -l -w

.PHONY: vet
vet: ## Run go vet
	go vet ./...

.PHONY: verify
verify: ## Fail when generated files are stale, Go files are not gofmt-ed or a doc or comment names a missing path
	hack/verify.sh

.PHONY: lint
lint: ## Run golangci-lint (.golangci.yml) and the import-boundary check
	hack/tools.sh golangci-lint
	@# Both checks run, so one report shows every problem.
	rc=0; $(GOLANGCI_LINT) run ./... || rc=1; hack/check-imports.sh || rc=1; exit $$rc

##@ Test

.PHONY: test
test: ## Run every suite (unit + integration on a real kube-apiserver/etcd) and verify; sets up what it needs
	hack/tools.sh $(TEST_TOOLS)
	hack/ensure-deb.sh $(TEST_DEB_PACKAGES)
	KUBEBUILDER_ASSETS=$(BIN)/k8s go test $(GO_TEST_FLAGS) ./...
	@# The race detector allocates, so the allocation budget runs uninstrumented.
	go test -count=1 -run 'TestSteadyStateAllocs' -v ./dispatcher/queue/ | grep -E '^(--- |ok|FAIL)'
	$(MAKE) --no-print-directory verify
	$(MAKE) --no-print-directory vulncheck

.PHONY: integration
integration: ## Run only the integration suites under test/
	hack/tools.sh $(TEST_TOOLS)
	KUBEBUILDER_ASSETS=$(BIN)/k8s go test $(GO_TEST_FLAGS) ./test/...

BENCH_COUNT ?= 5

.PHONY: bench
bench: ## Run the benchmarks behind docs/benchmarks.md (queue, dispatcher vs nginx, fleet, simulate)
	hack/ensure-deb.sh redis-server
	go test -run '^$$' -bench 'BenchmarkDispatch|BenchmarkNoisyNeighbour' -benchmem -count $(BENCH_COUNT) ./dispatcher/queue/
	go test -run '^$$' -bench 'AdmitRelease|RedisRoundTrip' -benchmem -count $(BENCH_COUNT) ./dispatcher/fleet/
	go test -run '^$$' -bench BenchmarkSeedHourOverload -benchmem -count $(BENCH_COUNT) ./simulate/
	bash hack/bench-dispatcher.sh $(BENCH_COUNT)

# The cluster scale figure: SCALE_PODS model pods on kwok, SCALE_DISPATCHERS
# dispatcher processes, SCALE_QUOTAS TenantQuotas, SCALE_ROUNDS scales to
# half and back. Develop with SCALE_PODS=100 SCALE_DISPATCHERS=4 SCALE_QUOTAS=20.
SCALE_PODS        ?= 1000
SCALE_DISPATCHERS ?= 20
SCALE_QUOTAS      ?= 200
SCALE_ROUNDS      ?= 3

.PHONY: bench-cluster
bench-cluster: ## Measure the controller and dispatchers following kubectl scale of a large Deployment on kwok (docs/benchmarks.md "Cluster scale"); writes bin/bench-cluster.{txt,json}
	hack/tools.sh k8s kwok
	@# A listener on each of the pod network's 2,046 addresses, and the clients' descriptors.
	ulimit -n "$$(ulimit -Hn)"; \
	TIERGATE_CLUSTER_SCALE=1 SCALE_PODS=$(SCALE_PODS) SCALE_DISPATCHERS=$(SCALE_DISPATCHERS) \
	SCALE_QUOTAS=$(SCALE_QUOTAS) SCALE_ROUNDS=$(SCALE_ROUNDS) SCALE_OUT=$(BIN)/bench-cluster.json \
	KUBEBUILDER_ASSETS=$(BIN)/k8s go test -count=1 -timeout=60m -run '^TestClusterScale$$' -v ./hack/bench/clusterscale/ \
		| tee $(BIN)/bench-cluster.txt

.PHONY: scheduling-doc
scheduling-doc: ## Regenerate docs/scheduling.md and its figures from the scenarios in examples/simulate/compare
	go test ./simulate/ -count=1 -run '^TestSchedulingDoc$$' -update

##@ Demo and image

# `make demo DURATION=30s` is the short version (test/demo runs it).
DURATION ?= 3m

.PHONY: demo
demo: ## Run tiergate end to end on this machine for DURATION (default 3m) and write demo-report/
	@# The demo needs the control plane: bin/k8s (kube-controller-manager
	@# and kube-scheduler with it), kwok and its Stage CRD. Static and
	@# trimmed like make build, so the two share compiled packages.
	hack/tools.sh k8s kwok
	CGO_ENABLED=0 go run -trimpath ./hack/demo --duration $(DURATION) --report demo-report

IMAGE_TAR ?= dist/tiergate-image.tar

.PHONY: image
image: ## Write an OCI image tarball of the static binary to $(IMAGE_TAR), without a container daemon
	go run ./hack/image --output $(IMAGE_TAR) --version $(VERSION)
