#!/usr/bin/env bash
# Usage: hack/check-imports.sh [--rule pure|no-client|no-dispatcher] [PACKAGE...]
#
# Enforces the import boundaries of docs/architecture.md#packages-and-import-rules over each
# package's whole non-test dependency closure, not only its direct imports:
#
#   pure       the queue and the policy wire type: nothing in the closure is
#              net/http or the Kubernetes API machinery (k8s.io/api,
#              apimachinery, client-go, k8s.io/kubernetes, controller-runtime).
#              k8s.io/utils/clock and sigs.k8s.io/yaml are allowed.
#   no-client  the capacity maths and the simulator: nothing in the closure
#              is a Kubernetes client (client-go, k8s.io/kubernetes,
#              controller-runtime). API types and apimachinery are allowed.
#   no-dispatcher  the controller side: nothing in the closure is under
#              github.com/tiergate/tiergate/dispatcher; what it shares with
#              the dispatcher is the wire contract in api/policy/v1.
#
# Without packages it checks ./dispatcher/queue, ./api/policy/v1 and
# ./dispatcher/balancer and ./dispatcher/tokens with pure, ./capacity and ./simulate with
# no-client, and ./capacity and ./controllers with no-dispatcher; a guarded
# package that does not exist yet is reported and skipped. Named packages
# are checked with --rule (default pure). Each check prints its rule.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

usage() {
	echo "usage: hack/check-imports.sh [--rule pure|no-client|no-dispatcher] [PACKAGE...]" >&2
	exit 2
}

forbidden_for() {
	case $1 in
	pure) echo '^(net/http|k8s\.io/api|k8s\.io/apimachinery|k8s\.io/client-go|k8s\.io/kubernetes|sigs\.k8s\.io/controller-runtime)(/|$)' ;;
	no-client) echo '^(k8s\.io/client-go|k8s\.io/kubernetes|sigs\.k8s\.io/controller-runtime)(/|$)' ;;
	no-dispatcher) echo '^github\.com/tiergate/tiergate/dispatcher(/|$)' ;;
	*) return 1 ;;
	esac
}

rule=pure
case ${1:-} in
--rule) [[ $# -ge 2 ]] || usage; rule=$2; shift 2 ;;
--rule=*) rule=${1#--rule=}; shift ;;
-*) usage ;;
esac
forbidden_for "$rule" >/dev/null || usage

# checks holds "rule package" pairs.
checks=()
if [[ $# -gt 0 ]]; then
	for p in "$@"; do checks+=("$rule $p"); done
else
	for c in "pure ./dispatcher/queue" "pure ./api/policy/v1" "pure ./dispatcher/balancer" "pure ./dispatcher/tokens" \
		"no-client ./capacity" "no-client ./simulate" "no-dispatcher ./capacity" "no-dispatcher ./controllers"; do
		p=${c#* }
		if compgen -G "$p/*.go" >/dev/null; then
			checks+=("$c")
		else
			echo "check-imports: $p does not exist yet; not checked"
		fi
	done
fi

status=0
for c in ${checks[@]+"${checks[@]}"}; do
	r=${c%% *} p=${c#* }
	forbidden=$(forbidden_for "$r")
	# One line per package of the closure: the package, then its imports.
	edges=$(go list -deps -f '{{.ImportPath}} {{join .Imports " "}}' "$p")
	# grep reads all its input (no -q): under pipefail, -q's early exit can
	# kill cut with SIGPIPE and turn a violation into "ok".
	if ! cut -d' ' -f1 <<<"$edges" | grep -E "$forbidden" >/dev/null; then
		echo "check-imports: $p ok ($r)"
		continue
	fi
	status=1
	echo "check-imports: $p depends on forbidden packages ($r); the way in:" >&2
	# Only the edges where an allowed package imports a forbidden one.
	awk -v re="$forbidden" '$1 !~ re { for (i = 2; i <= NF; i++) if ($i ~ re) print "  " $1 " imports " $i }' <<<"$edges" >&2
done
exit $status
