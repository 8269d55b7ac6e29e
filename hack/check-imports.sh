#!/usr/bin/env bash
# Usage: hack/check-imports.sh [PACKAGE...]
#
# Enforces the import boundary of DESIGN.md section 2: the queue and the
# policy wire type stay pure. Neither they nor anything they import (the
# whole non-test dependency closure, not only direct imports) may reach
# net/http or the Kubernetes API machinery. k8s.io/utils/clock and
# sigs.k8s.io/yaml are allowed.
#
# Without arguments it checks ./dispatcher/queue and ./dispatcher/policy;
# a guarded package that does not exist yet is reported and skipped.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

forbidden='^(net/http|k8s\.io/api|k8s\.io/apimachinery|k8s\.io/client-go|k8s\.io/kubernetes|sigs\.k8s\.io/controller-runtime)(/|$)'

pkgs=("$@")
if [[ ${#pkgs[@]} -eq 0 ]]; then
	for p in ./dispatcher/queue ./dispatcher/policy; do
		if compgen -G "$p/*.go" >/dev/null; then
			pkgs+=("$p")
		else
			echo "check-imports: $p does not exist yet; not checked"
		fi
	done
fi
if [[ ${#pkgs[@]} -eq 0 ]]; then
	exit 0
fi

status=0
for p in "${pkgs[@]}"; do
	# One line per package of the closure: the package, then its imports.
	edges=$(go list -deps -f '{{.ImportPath}} {{join .Imports " "}}' "$p")
	# grep reads all its input (no -q): under pipefail, -q's early exit can
	# kill cut with SIGPIPE and turn a violation into "ok".
	if ! cut -d' ' -f1 <<<"$edges" | grep -E "$forbidden" >/dev/null; then
		echo "check-imports: $p ok"
		continue
	fi
	status=1
	echo "check-imports: $p depends on forbidden packages; the way in:" >&2
	# Only the edges where an allowed package imports a forbidden one.
	awk -v re="$forbidden" '$1 !~ re { for (i = 2; i <= NF; i++) if ($i ~ re) print "  " $1 " imports " $i }' <<<"$edges" >&2
done
exit $status
