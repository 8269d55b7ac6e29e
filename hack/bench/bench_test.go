package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tiergate/tiergate/internal/testutil"
)

// Fixed concurrency of the throughput benchmark, and the open-loop rate of
// the latency benchmark.
const (
	concurrency = 32
	latencyRate = 1000
)

var targets = []struct{ name, env string }{
	{"direct", "BENCH_DIRECT"},
	{"reverseproxy", "BENCH_REVERSEPROXY"},
	{"nginx", "BENCH_NGINX"},
	{"tiergate", "BENCH_TIERGATE"},
	// An older tiergate (BENCH_BEFORE_REV), when asked for: before and
	// after in the same run.
	{"before", "BENCH_BEFORE"},
}

func target(b *testing.B, env string) string {
	addr := os.Getenv(env)
	if addr == "" {
		b.Skipf("%s not set; run hack/bench-dispatcher.sh", env)
	}
	return addr
}

// BenchmarkThroughput: closed loop at fixed concurrency against each target.
func BenchmarkThroughput(b *testing.B) {
	for _, tg := range targets {
		b.Run(tg.name, func(b *testing.B) {
			addr := target(b, tg.env)
			closedLoop(addr, concurrency, 2*concurrency, 10*time.Second) // warm the pool
			b.ResetTimer()
			r := closedLoop(addr, concurrency, b.N, 5*time.Minute)
			b.StopTimer()
			if r.errors > 0 || len(r.latencies) != r.n {
				b.Fatalf("%s: %d errors, %d of %d succeeded", tg.name, r.errors, len(r.latencies), r.n)
			}
			b.ReportMetric(float64(r.n)/r.elapsed.Seconds(), "req/s")
			b.ReportMetric(float64(r.quantile(.5).Microseconds()), "p50-µs")
			b.ReportMetric(float64(r.quantile(.99).Microseconds()), "p99-µs")
		})
	}
}

// BenchmarkLatency1000: open loop at 1,000 requests/s against each target.
func BenchmarkLatency1000(b *testing.B) {
	for _, tg := range targets {
		b.Run(tg.name, func(b *testing.B) {
			addr := target(b, tg.env)
			closedLoop(addr, concurrency, 2*concurrency, 10*time.Second)
			var gc0, gc1 runtime.MemStats
			runtime.ReadMemStats(&gc0)
			b.ResetTimer()
			r := openLoop(addr, latencyRate, b.N, 512, 5*time.Minute)
			b.StopTimer()
			runtime.ReadMemStats(&gc1)
			if r.errors > 0 || len(r.latencies) != r.n {
				b.Fatalf("%s: %d errors, %d of %d succeeded", tg.name, r.errors, len(r.latencies), r.n)
			}
			b.ReportMetric(float64(r.quantile(.5).Microseconds()), "p50-µs")
			b.ReportMetric(float64(r.quantile(.99).Microseconds()), "p99-µs")
			// The client's own share of the tail: how late requests left,
			// latency counted from when they were due, and its GC cycles.
			b.ReportMetric(float64(quantile(r.late, .99).Microseconds()), "late-p99-µs")
			b.ReportMetric(float64(quantile(r.fromSchedule, .99).Microseconds()), "due-p99-µs")
			b.ReportMetric(float64(gc1.NumGC-gc0.NumGC), "client-gcs")
		})
	}
}

// BenchmarkRefusal429: open loop at 10× the pool's capacity; the latency
// of the 429 answers, from tiergate (and the older one, when asked for).
func BenchmarkRefusal429(b *testing.B) {
	capacity, err := strconv.ParseFloat(os.Getenv("BENCH_OVERLOAD_RATE"), 64)
	if err != nil || capacity <= 0 {
		b.Fatalf("BENCH_OVERLOAD_RATE: %v", err)
	}
	for _, tg := range []struct{ name, env string }{{"tiergate", "BENCH_OVERLOAD"}, {"before", "BENCH_OVERLOAD_BEFORE"}} {
		b.Run(tg.name, func(b *testing.B) {
			addr := target(b, tg.env)
			b.ResetTimer()
			r := openLoop(addr, 10*capacity, b.N, 2048, 5*time.Minute)
			b.StopTimer()
			refused := r.byCode[http.StatusTooManyRequests]
			if r.errors > 0 || len(refused) < r.n/2 {
				b.Fatalf("%d errors, %d refusals of %d: not overloaded (%v)", r.errors, len(refused), r.n, r)
			}
			b.ReportMetric(float64(quantile(refused, .5).Microseconds()), "429-p50-µs")
			b.ReportMetric(float64(quantile(refused, .99).Microseconds()), "429-p99-µs")
			b.ReportMetric(float64(len(refused))/float64(r.n), "refused-fraction")
		})
	}
}

// BenchmarkFirstByte: time to the first event of a streamed answer whose
// 16 events the backend spreads over streamService (the first one after
// streamService/16), from 8 clients; a proxy that buffered the stream would
// show the whole service time instead.
func BenchmarkFirstByte(b *testing.B) {
	const streamService = 32 * time.Millisecond
	for _, tg := range targets {
		b.Run(tg.name, func(b *testing.B) {
			addr := target(b, tg.env)
			streamLoop(addr, 8, 16, streamService, 10*time.Second)
			b.ResetTimer()
			first, last, failed := streamLoop(addr, 8, b.N, streamService, 5*time.Minute)
			b.StopTimer()
			if failed > 0 || len(first) != b.N {
				b.Fatalf("%s: %d of %d streams failed", tg.name, failed, b.N)
			}
			b.ReportMetric(float64(quantile(first, .5).Microseconds()), "ttfb-p50-µs")
			b.ReportMetric(float64(quantile(first, .99).Microseconds()), "ttfb-p99-µs")
			b.ReportMetric(float64(quantile(last, .5).Microseconds()), "end-p50-µs")
		})
	}
}

// BenchmarkQueuedMemory: 10,000 clients queued at once (the only slot is
// held); the dispatcher's resident memory per queued request. b.N is not
// used: run with -benchtime=1x.
func BenchmarkQueuedMemory(b *testing.B) {
	addr := target(b, "BENCH_QUEUE")
	admin := target(b, "BENCH_QUEUE_ADMIN")
	pid := target(b, "BENCH_QUEUE_PID")
	const clients = 10000
	rss0 := rss(b, pid)
	live0 := goMemory(b, admin)
	conns := make([]net.Conn, 0, clients)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	req := fmt.Sprintf("POST /v1/completions HTTP/1.1\r\nHost: bench\r\nX-Tenant-ID: bench\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(reqBody), reqBody)
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for range clients {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err != nil {
				return
			}
			if _, err := io.WriteString(c, req); err != nil {
				c.Close()
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}()
	}
	wg.Wait()
	var queued int
	testutil.Eventually(b, time.Minute, "every client queued", func() error {
		if queued = queuedCount(b, admin); queued < clients {
			return fmt.Errorf("only %d of %d clients queued (%d connected)", queued, clients, len(conns))
		}
		return nil
	})
	// A measurement pause, not a wait for an event: the kernel's RSS
	// accounting lags the last allocations.
	time.Sleep(500 * time.Millisecond)
	rss1 := rss(b, pid)
	live1 := goMemory(b, admin)
	b.ReportMetric(float64(rss1-rss0)/clients/1024, "KiB/queued")
	b.ReportMetric(float64(live1-live0)/clients/1024, "heap+stack-KiB/queued")
	b.ReportMetric(float64(queued), "queued")
}

// rss reads VmRSS of pid in bytes.
func rss(b *testing.B, pid string) int64 {
	f, err := os.Open("/proc/" + pid + "/status")
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb * 1024
		}
	}
	b.Fatal("no VmRSS")
	return 0
}

func queuedCount(b *testing.B, admin string) int {
	req, _ := http.NewRequest(http.MethodGet, "http://"+admin+"/v1/stats", nil)
	req.Header.Set("Authorization", "Bearer "+os.Getenv("BENCH_QUEUE_TOKEN"))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	var s struct {
		Queue struct{ Queued int } `json:"queue"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		b.Fatal(err)
	}
	return s.Queue.Queued
}

// goMemory is the dispatcher's Go heap in use plus goroutine stacks, from
// its /metrics (unreclaimed garbage included, so an upper bound on live).
func goMemory(b *testing.B, admin string) int64 {
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	var total float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && (f[0] == "go_memstats_heap_inuse_bytes" || f[0] == "go_memstats_stack_inuse_bytes") {
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				b.Fatal(err)
			}
			total += v
		}
	}
	return int64(total)
}
