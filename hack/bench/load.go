package bench

import (
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

// outcome is one request's result.
type outcome struct {
	code    int
	latency time.Duration
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
		return outcome{latency: time.Since(start)}
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return outcome{code: resp.StatusCode, latency: time.Since(start)}
}

// result summarises a run.
type result struct {
	n         int
	errors    int
	elapsed   time.Duration
	latencies []time.Duration // sorted, successful (2xx) requests only
	byCode    map[int][]time.Duration
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
			}
		}
	}
	slices.Sort(r.latencies)
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
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			outs[i] = []outcome{send(ctx, c, addr)}
		}()
	}
	wg.Wait()
	return summarise(outs, time.Since(start))
}

func (r result) String() string {
	return fmt.Sprintf("n=%d errors=%d p50=%s p99=%s", r.n, r.errors, r.quantile(.5), r.quantile(.99))
}
