#!/usr/bin/env bash
# Usage: hack/bench-dispatcher.sh [COUNT]
#
# The dispatcher's benchmarks, all in one run on loopback:
#   - throughput and latency against simserver with zero service time,
#     direct and through a plain httputil.ReverseProxy, nginx and tiergate;
#   - 429 latency under 10x overload;
#   - memory per queued request at 10,000 queued clients;
#   - time to first byte of a streamed (SSE) answer, direct and tiergate.
# Latency, throughput and 429s are measured by two load generators: our own
# (hack/bench, go test benchmarks) and vegeta (bin/vegeta, hack/tools.sh
# vegeta). Each round runs every benchmark against every target, so a change
# in the machine's load hits all of them alike; COUNT rounds (default 5),
# and the summary prints medians over the rounds and ratios (Markdown, for
# docs/benchmarks.md "## Dispatcher"). Raw output is kept in $BENCH_OUT
# (default bin/bench-dispatcher.txt). After the rounds, a CPU profile of
# tiergate under the closed-loop load is written next to it
# (bench-dispatcher-cpu.pprof, with the binary it profiles,
# bench-dispatcher-tiergate, for go tool pprof).
#
# BENCH_BEFORE_REV=<git revision> also builds tiergate from that revision
# and measures it in the same rounds as target "before" (throughput,
# latency, 429s and first byte), so a change's before and after come from
# one run on one machine.
set -euo pipefail
cd "$(dirname "$0")/.."
count=${1:-5}
out=${BENCH_OUT:-bin/bench-dispatcher.txt}
mkdir -p "$(dirname "$out")"

if ! command -v nginx >/dev/null 2>&1 && [[ ! -x /usr/sbin/nginx ]]; then
	hack/ensure-deb.sh nginx
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
hack/tools.sh vegeta >&2
VEGETA=$PWD/bin/vegeta

# 10,000 queued clients need as many descriptors in the dispatcher and in
# the load generator.
ulimit -n "$(ulimit -Hn)" || true
if [[ $(ulimit -n) != unlimited && $(ulimit -n) -lt 12000 ]]; then
	echo "bench-dispatcher: need at least 12000 open files (ulimit -n is $(ulimit -n))" >&2
	exit 1
fi

tmp=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	[[ -f $tmp/nginx.pid ]] && kill "$(cat "$tmp/nginx.pid")" 2>/dev/null || true
	wait 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT

go build -o "$tmp/tiergate" .
go build -o "$tmp/simserver" ./hack/simserver
go build -o "$tmp/rproxy" ./hack/bench/rproxy
go build -o "$tmp/vegetastat" ./hack/bench/vegetastat
before_rev=${BENCH_BEFORE_REV:-}
if [[ -n $before_rev ]]; then
	mkdir "$tmp/before-src"
	git archive "$before_rev" | tar -x -C "$tmp/before-src"
	(cd "$tmp/before-src" && go build -o "$tmp/tiergate-before" .)
fi

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
wait_up() {
	for _ in $(seq 100); do
		if curl -fsS -o /dev/null "$1" 2>/dev/null; then return 0; fi
		sleep 0.1
	done
	echo "bench-dispatcher: $1 did not come up" >&2
	exit 1
}

SIM=127.0.0.1:$(port); RP=127.0.0.1:$(port); NG=127.0.0.1:$(port)
TG=127.0.0.1:$(port); TGA=127.0.0.1:$(port)
SIM2=127.0.0.1:$(port); OV=127.0.0.1:$(port); OVA=127.0.0.1:$(port)
QU=127.0.0.1:$(port); QUA=127.0.0.1:$(port)
TGB=127.0.0.1:$(port); TGBA=127.0.0.1:$(port); OVB=127.0.0.1:$(port); OVBA=127.0.0.1:$(port)
token=bench-token
echo "$token" >"$tmp/token"

"$tmp/simserver" --listen "$SIM" --concurrency 4096 --service-time 0 2>"$tmp/sim.log" & pids+=($!)
"$tmp/rproxy" --listen "$RP" --backend "$SIM" 2>"$tmp/rproxy.log" & pids+=($!)
mkdir -p "$tmp/nginx"
cat >"$tmp/nginx.conf" <<NGINX
worker_processes auto;
pid $tmp/nginx.pid;
error_log $tmp/nginx/error.log warn;
events { worker_connections 16384; }
http {
	access_log off;
	client_body_temp_path $tmp/nginx/body;
	proxy_temp_path $tmp/nginx/proxy;
	fastcgi_temp_path $tmp/nginx/fastcgi;
	uwsgi_temp_path $tmp/nginx/uwsgi;
	scgi_temp_path $tmp/nginx/scgi;
	upstream sim { server $SIM; keepalive 256; }
	server {
		listen $NG;
		location / {
			proxy_pass http://sim;
			proxy_http_version 1.1;
			proxy_set_header Connection "";
			proxy_buffering off;
		}
	}
}
NGINX
"$NGINX" -c "$tmp/nginx.conf" -p "$tmp/nginx"

# The tiergate under test: plenty of slots, one premium tenant.
cat >"$tmp/policy.json" <<JSON
{"version":1,"pool":"bench/sim","slots":1024,"serviceRate":10000,"ageingRate":6,
 "authentication":{"mode":"TrustedHeader","headerName":"X-Tenant-ID"},
 "tiers":[{"name":"premium","basePriority":0,"tolerableWaitSeconds":5,"queueBound":100000,
           "tenantConcurrencyLimit":1024,"tenantQueueLimit":100000}],
 "tenants":[{"id":"bench","tier":"premium"}],
 "backends":[{"address":"$SIM","scheme":"http"}]}
JSON
"$tmp/tiergate" dispatcher --listen "$TG" --admin-listen "$TGA" --policy-file "$tmp/policy.json" \
	--enable-profiling --admin-token-file "$tmp/token" 2>"$tmp/tg.log" & pids+=($!)

# A small pool for the overload run: 4 slots of 50ms = 80 requests/s; the
# tier's W of 1s bounds its queue at 80.
"$tmp/simserver" --listen "$SIM2" --concurrency 8 --service-time const:50ms 2>"$tmp/sim2.log" & pids+=($!)
cat >"$tmp/overload.json" <<JSON
{"version":1,"pool":"bench/overload","slots":4,"serviceRate":80,"ageingRate":6,
 "authentication":{"mode":"TrustedHeader","headerName":"X-Tenant-ID"},
 "tiers":[{"name":"premium","basePriority":0,"tolerableWaitSeconds":1,"queueBound":80,
           "tenantConcurrencyLimit":4,"tenantQueueLimit":80}],
 "tenants":[{"id":"bench","tier":"premium"}],
 "backends":[{"address":"$SIM2","scheme":"http"}]}
JSON
"$tmp/tiergate" dispatcher --listen "$OV" --admin-listen "$OVA" --policy-file "$tmp/overload.json" 2>"$tmp/ov.log" & pids+=($!)
if [[ -n $before_rev ]]; then
	"$tmp/tiergate-before" dispatcher --listen "$TGB" --admin-listen "$TGBA" --policy-file "$tmp/policy.json" 2>"$tmp/tgb.log" & pids+=($!)
	"$tmp/tiergate-before" dispatcher --listen "$OVB" --admin-listen "$OVBA" --policy-file "$tmp/overload.json" 2>"$tmp/ovb.log" & pids+=($!)
fi

# One slot, held for the whole run, and room for 20,000 queued requests.
cat >"$tmp/queue.json" <<JSON
{"version":1,"pool":"bench/queue","slots":1,"serviceRate":1,"ageingRate":6,
 "authentication":{"mode":"TrustedHeader","headerName":"X-Tenant-ID"},
 "tiers":[{"name":"premium","basePriority":0,"tolerableWaitSeconds":3600,"queueBound":20000,
           "tenantConcurrencyLimit":1,"tenantQueueLimit":20000}],
 "tenants":[{"id":"bench","tier":"premium"},{"id":"holder","tier":"premium"}],
 "backends":[{"address":"$SIM2","scheme":"http"}]}
JSON
# start_queue (re)starts that dispatcher, so each round measures a fresh
# process's growth, and holds its slot with a request of one hour.
start_queue() {
	if [[ -n ${qpid:-} ]]; then
		kill "$qpid" "$hpid" 2>/dev/null || true
		wait "$qpid" "$hpid" 2>/dev/null || true
	fi
	"$tmp/tiergate" dispatcher --listen "$QU" --admin-listen "$QUA" --admin-token-file "$tmp/token" \
		--policy-file "$tmp/queue.json" 2>>"$tmp/qu.log" &
	qpid=$!
	pids+=($qpid)
	wait_up "http://$QUA/readyz"
	curl -sS -o /dev/null -X POST "http://$QU/v1/completions" -H 'X-Tenant-ID: holder' \
		-H 'X-Sim-Service-Time: 1h' -d '{"prompt":"hold"}' --max-time 3600 &
	hpid=$!
	pids+=($hpid)
	export BENCH_QUEUE_PID=$qpid
}

wait_up "http://$SIM/health"; wait_up "http://$RP/health"; wait_up "http://$NG/health"
wait_up "http://$TGA/readyz"; wait_up "http://$OVA/readyz"

export BENCH_DIRECT=$SIM BENCH_REVERSEPROXY=$RP BENCH_NGINX=$NG BENCH_TIERGATE=$TG
export BENCH_OVERLOAD=$OV BENCH_OVERLOAD_RATE=80
export BENCH_QUEUE=$QU BENCH_QUEUE_ADMIN=$QUA BENCH_QUEUE_TOKEN=$token

# Rounds interleave the targets, so a change in the machine's load during
# the run hits every target alike; medians are taken over the rounds.
go test -c -o "$tmp/bench.test" ./hack/bench
run() { "$tmp/bench.test" -test.run '^$' "$@" | grep '^Benchmark' | tee -a "$out"; }

# vegeta NAME ADDR ARGS...: one vegeta attack on ADDR with ARGS, as a
# benchmark line NAME (vegetastat). vegeta's defaults otherwise: its own
# worker pool and keep-alive connections, response bodies read whole.
printf '%s' '{"model":"sim-model","prompt":"hello","max_tokens":16}' >"$tmp/body.json"
vegeta() {
	local name=$1 addr=$2
	shift 2
	printf 'POST http://%s/v1/completions\nContent-Type: application/json\nX-Tenant-ID: bench\n@%s\n' "$addr" "$tmp/body.json" >"$tmp/targets"
	"$VEGETA" attack -targets "$tmp/targets" "$@" | "$VEGETA" encode | "$tmp/vegetastat" -name "$name" | tee -a "$out"
}
declare -A addr=([direct]=$SIM [reverseproxy]=$RP [nginx]=$NG [tiergate]=$TG)
targets=(direct reverseproxy nginx tiergate)
declare -A overload=([tiergate]=$OV)
if [[ -n $before_rev ]]; then
	wait_up "http://$TGBA/readyz"; wait_up "http://$OVBA/readyz"
	addr[before]=$TGB
	overload[before]=$OVB
	targets+=(before)
	export BENCH_BEFORE=$TGB BENCH_OVERLOAD_BEFORE=$OVB BENCH_BEFORE_REV=$before_rev
fi

: >"$out"
for round in $(seq "$count"); do
	echo "round $round/$count (load average: $(cut -d' ' -f1-3 /proc/loadavg))" >&2
	start_queue
	run -test.bench '^BenchmarkThroughput$' -test.benchtime 20000x
	for t in "${targets[@]}"; do vegeta "VegetaThroughput/$t" "${addr[$t]}" -rate 0 -workers 32 -max-workers 32 -duration 5s; done
	run -test.bench '^BenchmarkLatency1000$' -test.benchtime 5000x
	for t in "${targets[@]}"; do vegeta "VegetaLatency1000/$t" "${addr[$t]}" -rate 1000 -duration 5s; done
	run -test.bench '^BenchmarkRefusal429$' -test.benchtime 4000x
	for t in "${!overload[@]}"; do vegeta "VegetaRefusal429/$t" "${overload[$t]}" -rate 800 -duration 5s; done
	run -test.bench '^BenchmarkFirstByte$' -test.benchtime 500x
	run -test.bench '^BenchmarkQueuedMemory$' -test.benchtime 1x
done

# The profile: 10 s of tiergate's CPU while vegeta keeps 32 connections busy.
prof=${out%.txt}-cpu.pprof
printf 'POST http://%s/v1/completions\nContent-Type: application/json\nX-Tenant-ID: bench\n@%s\n' "$TG" "$tmp/body.json" >"$tmp/targets"
"$VEGETA" attack -targets "$tmp/targets" -rate 0 -workers 32 -max-workers 32 -duration 12s >/dev/null &
load=$!
sleep 1
curl -fsS -H "Authorization: Bearer $token" -o "$prof" "http://$TGA/debug/pprof/profile?seconds=10"
wait "$load"
cp "$tmp/tiergate" "${out%.txt}-tiergate"
echo "bench-dispatcher: CPU profile in $prof (go tool pprof -top -cum ${out%.txt}-tiergate $prof)" >&2

echo
go run ./hack/bench/summarize <"$out"
