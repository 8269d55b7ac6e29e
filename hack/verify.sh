#!/usr/bin/env bash
# Fails when the generated files in the tree are stale, a tracked Go file
# is not gofmt-ed, or a tracked doc or comment refers to a path that does
# not exist (untracked work in progress is not judged). It regenerates
# into a temporary directory (through the same make targets, with their
# output directories pointed there) and compares, so it never touches the
# work tree.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

make -s --no-print-directory manifests generate \
	CRD_DIR="$tmp/crd" CHART_CRD_DIR="$tmp/chart-crds" RBAC_DIR="$tmp/rbac" DEEPCOPY_DIR="$tmp/deepcopy" >/dev/null

stale=0
report() {
	echo "verify: $1 is stale; run 'make manifests generate' and commit the result" >&2
	stale=1
}

diff -ru config/crd/bases "$tmp/crd" >&2 || report config/crd/bases
diff -ru charts/tiergate/crds "$tmp/crd" >&2 || report charts/tiergate/crds
diff -u api/v1alpha1/zz_generated.deepcopy.go "$tmp/deepcopy/zz_generated.deepcopy.go" >&2 ||
	report api/v1alpha1/zz_generated.deepcopy.go
# controller-gen writes no role.yaml while no +kubebuilder:rbac marker exists.
if [[ -f $tmp/rbac/role.yaml || -f config/rbac/role.yaml ]]; then
	diff -u config/rbac/role.yaml "$tmp/rbac/role.yaml" >&2 || report config/rbac/role.yaml
fi

gofiles=()
while IFS= read -r f; do
	[[ -f $f ]] && gofiles+=("$f") # skip tracked files deleted in the work tree
done < <(git ls-files '*.go')
if [[ ${#gofiles[@]} -gt 0 ]]; then
	unformatted=$(gofmt -l "${gofiles[@]}")
	if [[ -n $unformatted ]]; then
		echo "verify: not gofmt-ed (run 'make fmt'):" >&2
		echo "$unformatted" >&2
		stale=1
	fi
fi

# A doc or comment naming a path of the repository must find it there
# (hack/checkrefs says which file and line does not).
go build -o "$tmp/checkrefs" ./hack/checkrefs
if ! "$tmp/checkrefs" "$root" >/dev/null; then
	echo "verify: dangling references (fix the path or the reference)" >&2
	stale=1
fi

if [[ $stale -ne 0 ]]; then
	exit 1
fi
echo "verify: generated files are current, Go files are gofmt-ed and every referenced path exists"
