#!/usr/bin/env bash
# Builds the test control plane and the developer tools into bin/.
#
#   bin/k8s/{kube-apiserver,etcd,kubectl,kube-controller-manager,kube-scheduler}
#   from the hack/tools module, in one go build
#   bin/k8s/kwok, kwok's controller (fake nodes that play pods through Stage
#   objects) with go install from its own module, and bin/kwok/, the Stage
#   CRD from that module, which the cluster suites install
#   bin/{helm,controller-gen,golangci-lint} with go install pkg@version
#   bin/{govulncheck,indexdb} with go install pkg@version,
#   bin/vulndb, the offline vulnerability database that indexdb builds from
#   the data/osv folder of a pinned golang.org/x/vulndb module, and
#   bin/keda/keda.sh_scaledobjects.yaml, KEDA's own ScaledObject CRD from the
#   pinned github.com/kedacore/keda/v2 module, which the suites install on
#   the test API server (the module is only downloaded, never built or
#   required by a go.mod)
#   bin/vegeta, the load generator of make bench, from its own module
#   hack/tools/vegeta (apart from hack/tools, so its dependencies cannot move
#   the control plane's versions and a change to it does not rebuild bin/k8s)
#
# Usage: hack/tools.sh [k8s|kwok|helm|controller-gen|golangci-lint|govulncheck|vulndb|keda|vegeta]...
# (no argument: all of them but vegeta, which only make bench needs)
#
# Everything comes from the Go module proxy; nothing else is downloaded.
# Each tool carries a stamp keyed on what it was built from (the pinned
# version, the Go version and, for the control plane, the hack/tools
# module's go.mod, go.sum and sources), so a run with nothing changed does
# no work.
set -euo pipefail

# Pinned versions. Kubernetes' staging modules are pinned in hack/tools/go.mod.
K8S_VERSION=v1.37.2
HELM_VERSION=v3.22.0
CONTROLLER_TOOLS_VERSION=v0.23.0
GOLANGCI_LINT_VERSION=v2.15.0
GOVULNCHECK_VERSION=v1.9.0
# The vulnerability data: a pseudo-version of golang.org/x/vulndb. Moving it
# forward is how new advisories reach `make vulncheck`.
VULNDB_VERSION=v0.0.0-20261105234957-e22db6528018
# KEDA, whose ScaledObject CRD the controller's ScaledObjects must satisfy.
KEDA_VERSION=v2.21.0
# kwok, built from its own go.mod (its Kubernetes libraries are v0.36, so
# it shares no compiled package with bin/k8s; it talks to the API server
# over the wire only).
KWOK_VERSION=v0.8.0

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=$root/bin
export GOWORK=off

groups=("$@")
for g in "${groups[@]}"; do
	case $g in
	k8s | kwok | helm | controller-gen | golangci-lint | govulncheck | vulndb | keda | vegeta) ;;
	*)
		echo "tools: unknown tool $g (want k8s, kwok, helm, controller-gen, golangci-lint, govulncheck, vulndb, keda or vegeta)" >&2
		exit 2
		;;
	esac
done

# wanted NAME: true when NAME was asked for, or nothing was (vegeta only
# when asked for).
wanted() {
	[[ ${#groups[@]} -eq 0 && $1 != vegeta ]] && return 0
	local g
	for g in "${groups[@]}"; do
		[[ $g == "$1" ]] && return 0
	done
	return 1
}

goversion=$(go env GOVERSION)

# Two `make test` runs in one tree must not build into bin/ at once.
mkdir -p "$bin"
exec 9>"$bin/.tools.lock"
flock 9

# stamp_key WORD... -- FILE...: a hash of the Go version, the words and the
# files' names and contents.
stamp_key() {
	{
		printf '%s\n' "$goversion"
		while [[ $# -gt 0 && $1 != -- ]]; do
			printf '%s\n' "$1"
			shift
		done
		[[ $# -gt 0 ]] && shift
		local f
		for f in "$@"; do
			printf '%s\n' "${f#"$root"/}"
			cat "$f"
		done
	} | sha256sum | cut -d' ' -f1
}

# current STAMP KEY BINARY...: true when STAMP holds KEY and every binary
# exists and is executable.
current() {
	local stamp=$1 key=$2
	shift 2
	[[ -f $stamp && $(<"$stamp") == "$key" ]] || return 1
	local b
	for b in "$@"; do
		[[ -x $b ]] || return 1
	done
}

# check_version NAME WANT ARG...: bin/k8s/NAME ARG... prints the line WANT.
check_version() {
	local name=$1 want=$2 got
	shift 2
	got=$("$bin/k8s/$name" "$@")
	if ! grep -qxF "$want" <<<"$got"; then
		echo "tools: bin/k8s/$name reports the wrong version (want \"$want\"):" >&2
		echo "$got" >&2
		exit 1
	fi
}

build_control_plane() {
	local minor=${K8S_VERSION#v1.}
	minor=${minor%%.*}
	local ldflags="-X k8s.io/component-base/version.gitVersion=${K8S_VERSION} -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${minor}"
	local files
	# hack/tools/vegeta is a module of its own, not part of the control plane.
	mapfile -t files < <(cd "$root" && find hack/tools -path hack/tools/vegeta -prune -o \( -name '*.go' -o -name go.mod -o -name go.sum \) -print | LC_ALL=C sort)
	local key stamp=$bin/k8s/.stamp
	key=$(stamp_key "k8s $K8S_VERSION" "$ldflags" -- "${files[@]/#/$root/}")
	local names=(kube-apiserver etcd kubectl kube-controller-manager kube-scheduler)
	if current "$stamp" "$key" "${names[@]/#/$bin/k8s/}"; then
		echo "tools: bin/k8s is current (kube-apiserver, etcd, kubectl, kube-controller-manager, kube-scheduler ${K8S_VERSION})"
		return
	fi
	echo "tools: building bin/k8s/{kube-apiserver,etcd,kubectl,kube-controller-manager,kube-scheduler} ${K8S_VERSION} (the first build takes minutes)"
	mkdir -p "$bin/k8s"
	rm -f "$stamp"
	# One go build for the five, so the packages they share (most of
	# Kubernetes and etcd's client) are loaded and scheduled once and the
	# links overlap the compiles. -o DIR/ names each binary after its
	# package directory. etcd links none of the stamped symbols; -X leaves
	# it alone.
	(cd "$root/hack/tools" && go build -ldflags "$ldflags" -o "$bin/k8s/" "${names[@]/#/./cmd/}")
	# Unstamped binaries report v0.0.0-master, which breaks Helm's KubeVersion.
	check_version kubectl "Client Version: ${K8S_VERSION}" version --client
	local n
	for n in kube-apiserver kube-controller-manager kube-scheduler; do
		check_version "$n" "Kubernetes ${K8S_VERSION}" --version
	done
	echo "$key" >"$stamp"
}

# install_tool NAME PACKAGE VERSION [LDFLAGS]
install_tool() {
	local name=$1 pkg=$2 version=$3 ldflags=${4:-}
	local key stamp=$bin/.$name.stamp
	key=$(stamp_key "$pkg@$version" "$ldflags")
	if current "$stamp" "$key" "$bin/$name"; then
		echo "tools: bin/$name is current ($version)"
		return
	fi
	echo "tools: installing bin/$name $version"
	mkdir -p "$bin"
	rm -f "$stamp"
	GOBIN=$bin go install -ldflags "$ldflags" "$pkg@$version"
	echo "$key" >"$stamp"
}

if wanted k8s; then build_control_plane; fi

# module_dir MODULE@VERSION: the module's directory in the module cache
# (downloading it through the proxy when missing).
module_dir() {
	(cd "$root/hack/tools" && go mod download -json "$1") | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'
}

# build_kwok: bin/k8s/kwok with go install (kwok's own go.mod, no
# replace directives), and bin/kwok/kwok.x-k8s.io_stages.yaml, the Stage
# CRD of the same module version.
build_kwok() {
	local crd=$bin/kwok/kwok.x-k8s.io_stages.yaml
	local key stamp=$bin/kwok/.stamp
	key=$(stamp_key "sigs.k8s.io/kwok@$KWOK_VERSION")
	if current "$stamp" "$key" "$bin/k8s/kwok" && [[ -f $crd ]]; then
		echo "tools: bin/k8s/kwok is current ($KWOK_VERSION)"
		return
	fi
	echo "tools: installing bin/k8s/kwok $KWOK_VERSION and its Stage CRD into bin/kwok"
	mkdir -p "$bin/k8s" "$bin/kwok"
	rm -f "$stamp"
	GOBIN=$bin/k8s go install "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
	local dir
	dir=$(module_dir "sigs.k8s.io/kwok@$KWOK_VERSION")
	local src=$dir/kustomize/crd/bases/kwok.x-k8s.io_stages.yaml
	if [[ -z $dir || ! -f $src ]]; then
		echo "tools: sigs.k8s.io/kwok@$KWOK_VERSION has no kustomize/crd/bases/kwok.x-k8s.io_stages.yaml (got dir '$dir')" >&2
		exit 1
	fi
	install -m 0644 "$src" "$crd"
	local got
	got=$("$bin/k8s/kwok" --version)
	if [[ $got != "kwok version ${KWOK_VERSION} "* ]]; then
		echo "tools: bin/k8s/kwok reports the wrong version (want $KWOK_VERSION): $got" >&2
		exit 1
	fi
	echo "$key" >"$stamp"
}
if wanted kwok; then build_kwok; fi
# Helm's release builds stamp the Kubernetes version it assumes offline
# (helm template, helm lint); a plain go install leaves v1.20, which this
# chart's kubeVersion refuses.
helm_k8s_minor=${K8S_VERSION#v1.}
helm_k8s_minor=${helm_k8s_minor%%.*}
helm_ldflags="-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=${helm_k8s_minor} -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=${helm_k8s_minor} -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}"
if wanted helm; then install_tool helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION" "$helm_ldflags"; fi
if wanted controller-gen; then install_tool controller-gen sigs.k8s.io/controller-tools/cmd/controller-gen "$CONTROLLER_TOOLS_VERSION"; fi
if wanted golangci-lint; then install_tool golangci-lint github.com/golangci/golangci-lint/v2/cmd/golangci-lint "$GOLANGCI_LINT_VERSION"; fi
if wanted govulncheck; then install_tool govulncheck golang.org/x/vuln/cmd/govulncheck "$GOVULNCHECK_VERSION"; fi

# build_vulndb: bin/vulndb, in the layout `govulncheck -db file://…` reads,
# from the OSV files of the pinned golang.org/x/vulndb module. Nothing
# reaches the public vulnerability service.
build_vulndb() {
	install_tool indexdb golang.org/x/vulndb/cmd/indexdb "$VULNDB_VERSION"
	local key stamp=$bin/vulndb/.stamp
	key=$(stamp_key "golang.org/x/vulndb@$VULNDB_VERSION" -- "$bin/indexdb")
	if [[ -f $stamp && $(<"$stamp") == "$key" && -f $bin/vulndb/index/db.json ]]; then
		echo "tools: bin/vulndb is current (golang.org/x/vulndb $VULNDB_VERSION)"
		return
	fi
	echo "tools: building bin/vulndb from golang.org/x/vulndb $VULNDB_VERSION"
	local dir
	dir=$(go mod download -json "golang.org/x/vulndb@$VULNDB_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	if [[ -z $dir || ! -d $dir/data/osv ]]; then
		echo "tools: golang.org/x/vulndb@$VULNDB_VERSION has no data/osv (got dir '$dir')" >&2
		exit 1
	fi
	rm -rf "$bin/vulndb" "$bin/vulndb.tmp"
	"$bin/indexdb" -vulns "$dir/data/osv" -out "$bin/vulndb.tmp"
	mv "$bin/vulndb.tmp" "$bin/vulndb"
	echo "$key" >"$stamp"
}
if wanted vulndb; then build_vulndb; fi

# copy_keda_crd: bin/keda/keda.sh_scaledobjects.yaml from the module cache.
copy_keda_crd() {
	local out=$bin/keda/keda.sh_scaledobjects.yaml
	local key stamp=$bin/keda/.stamp
	key=$(stamp_key "github.com/kedacore/keda/v2@$KEDA_VERSION")
	if [[ -f $stamp && $(<"$stamp") == "$key" && -f $out ]]; then
		echo "tools: bin/keda is current (KEDA $KEDA_VERSION ScaledObject CRD)"
		return
	fi
	echo "tools: copying KEDA $KEDA_VERSION's ScaledObject CRD into bin/keda"
	local dir
	dir=$(cd "$root/hack/tools" && go mod download -json "github.com/kedacore/keda/v2@$KEDA_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	local src=$dir/config/crd/bases/keda.sh_scaledobjects.yaml
	if [[ -z $dir || ! -f $src ]]; then
		echo "tools: github.com/kedacore/keda/v2@$KEDA_VERSION has no config/crd/bases/keda.sh_scaledobjects.yaml (got dir '$dir')" >&2
		exit 1
	fi
	mkdir -p "$bin/keda"
	rm -f "$stamp"
	# The module cache is read-only; the copy is not.
	install -m 0644 "$src" "$out"
	echo "$key" >"$stamp"
}
if wanted keda; then copy_keda_crd; fi

# build_vegeta: bin/vegeta from the tool directive of hack/tools/vegeta/go.mod.
build_vegeta() {
	local version ldflags key stamp=$bin/.vegeta.stamp
	version=$(cd "$root/hack/tools/vegeta" && go list -m -f '{{.Version}}' github.com/tsenart/vegeta/v12)
	ldflags="-X main.Version=$version"
	key=$(stamp_key "vegeta $version" "$ldflags" -- "$root/hack/tools/vegeta/go.mod" "$root/hack/tools/vegeta/go.sum")
	if current "$stamp" "$key" "$bin/vegeta"; then
		echo "tools: bin/vegeta is current ($version)"
		return
	fi
	echo "tools: building bin/vegeta $version"
	rm -f "$stamp"
	(cd "$root/hack/tools/vegeta" && go build -ldflags "$ldflags" -o "$bin/vegeta" github.com/tsenart/vegeta/v12)
	echo "$key" >"$stamp"
}
if wanted vegeta; then build_vegeta; fi
