package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// reqBody is a small completion request, as a chat client would send.
const reqBody = `{"model":"sim-model","prompt":"hello","max_tokens":16}`

// newClient returns a keep-alive client for concurrency connections.
func newClient(concurrency int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConnsPerHost: concurrency,
		MaxConnsPerHost:     0,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}}
}

// outcome is one request's result. late is how long after its scheduled
// time an open-loop request was sent (0 in a closed loop).
type outcome struct {
	code    int
	latency time.Duration
	late    time.Duration
	sent    time.Time
}

// send does one POST /v1/completions to addr as the bench tenant.
func send(ctx context.Context, c *http.Client, addr string) outcome {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/completions", strings.NewReader(reqBody))
	if err != nil {
		return outcome{}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Tenant-ID", "bench")
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return outcome{latency: time.Since(start), sent: start}
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return outcome{code: resp.StatusCode, latency: time.Since(start), sent: start}
}

// result summarises a run.
type result struct {
	n         int
	errors    int
	elapsed   time.Duration
	latencies []time.Duration // sorted, successful (2xx) requests only
	byCode    map[int][]time.Duration
	// late and fromSchedule (sorted, 2xx only): how late each request was
	// sent, and its latency counted from when it was due, not from when it
	// was sent (the coordinated-omission view).
	late, fromSchedule []time.Duration
}

func (r result) quantile(q float64) time.Duration { return quantile(r.latencies, q) }

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func summarise(outs [][]outcome, elapsed time.Duration) result {
	r := result{elapsed: elapsed, byCode: map[int][]time.Duration{}}
	for _, o := range outs {
		for _, x := range o {
			r.n++
			if x.code == 0 {
				r.errors++
				continue
			}
			r.byCode[x.code] = append(r.byCode[x.code], x.latency)
			if x.code/100 == 2 {
				r.latencies = append(r.latencies, x.latency)
				r.late = append(r.late, x.late)
				r.fromSchedule = append(r.fromSchedule, x.late+x.latency)
			}
		}
	}
	slices.Sort(r.latencies)
	slices.Sort(r.late)
	slices.Sort(r.fromSchedule)
	for _, l := range r.byCode {
		slices.Sort(l)
	}
	return r
}

// closedLoop runs n requests from concurrency clients, each sending its
// next request when the previous one is answered. It stops at deadline.
func closedLoop(addr string, concurrency, n int, deadline time.Duration) result {
	c := newClient(concurrency)
	defer c.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	var next atomic.Int64
	outs := make([][]outcome, concurrency)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := make([]outcome, 0, n/concurrency+1)
			for next.Add(1) <= int64(n) && ctx.Err() == nil {
				mine = append(mine, send(ctx, c, addr))
			}
			outs[w] = mine
		}()
	}
	wg.Wait()
	return summarise(outs, time.Since(start))
}

// openLoop sends n requests at a fixed rate, each on its own schedule
// whatever the answers do (at most maxInFlight outstanding).
func openLoop(addr string, rate float64, n, maxInFlight int, deadline time.Duration) result {
	c := newClient(maxInFlight)
	defer c.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	sem := make(chan struct{}, maxInFlight)
	outs := make([][]outcome, n)
	var wg sync.WaitGroup
	start := time.Now()
	interval := time.Duration(float64(time.Second) / rate)
	for i := range n {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d)
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		due := start.Add(time.Duration(i) * interval)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			o := send(ctx, c, addr)
			o.late = o.sent.Sub(due)
			outs[i] = []outcome{o}
		}()
	}
	wg.Wait()
	return summarise(outs, time.Since(start))
}

func (r result) String() string {
	return fmt.Sprintf("n=%d errors=%d p50=%s p99=%s", r.n, r.errors, r.quantile(.5), r.quantile(.99))
}

// streamBody asks for a streamed answer of 16 events spread over the
// simserver service time the X-Sim-Service-Time header sets.
const streamBody = `{"model":"sim-model","prompt":"hello","max_tokens":16,"stream":true}`

// firstByte is one streamed request's time to its first event and to its end.
type firstByte struct {
	first, last time.Duration
	ok          bool
}

// sendStream does one streamed POST /v1/completions and times the first
// "data:" line and the end of the stream.
func sendStream(ctx context.Context, c *http.Client, addr string, service time.Duration) firstByte {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/completions", strings.NewReader(streamBody))
	if err != nil {
		return firstByte{}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Tenant-ID", "bench")
	req.Header.Set("X-Sim-Service-Time", service.String())
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return firstByte{}
	}
	defer resp.Body.Close()
	var fb firstByte
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if fb.first == 0 && strings.HasPrefix(sc.Text(), "data:") {
			fb.first = time.Since(start)
		}
	}
	fb.last = time.Since(start)
	fb.ok = resp.StatusCode == http.StatusOK && sc.Err() == nil && fb.first > 0
	return fb
}

// streamLoop runs n streamed requests from concurrency clients.
func streamLoop(addr string, concurrency, n int, service, deadline time.Duration) (first, last []time.Duration, failed int) {
	c := newClient(concurrency)
	defer c.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	var mu sync.Mutex
	var next atomic.Int64
	var wg sync.WaitGroup
	for range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) && ctx.Err() == nil {
				fb := sendStream(ctx, c, addr, service)
				mu.Lock()
				if fb.ok {
					first, last = append(first, fb.first), append(last, fb.last)
				} else {
					failed++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	slices.Sort(first)
	slices.Sort(last)
	return first, last, failed
}
