package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher"
	"github.com/tiergate/tiergate/dispatcher/queue"
)

// dispatcherRef is one dispatcher process.
type dispatcherRef struct {
	Name  string // its Pod's name
	Admin string // host:port of the admin API
	Data  string // host:port of the data port
}

// sample is the pool as the dispatchers report it at one instant: GET
// /v1/stats, GET /v1/policy (when the version changed) and GET /metrics of
// every dispatcher, summed.
type sample struct {
	T         time.Duration // since the load started (negative before)
	OK        bool          // every dispatcher answered
	Err       string
	Slots     int
	InFlight  int
	Backends  int     // of the first dispatcher's policy
	Versions  []int64 // applied policy version per dispatcher
	Ready     int     // dispatchers with a policy and not draining
	Queued    int
	Totals    queue.Totals // every job the queues admitted, and how it ended
	Tiers     map[string]tierSample
	Refused   map[string]map[string]float64 // tiergate_rejections_total: tier → cause → count
	Responses map[string]map[string]float64 // tiergate_requests_total: tier → code → count
	Waits     map[string]*histogram         // tiergate_queue_wait_seconds per tier
	// FairGap is tiergate_fairness_gap_tokens per tier, the largest over
	// the dispatchers (each orders its own queue), and FairGapBound
	// tiergate_fairness_gap_bound_tokens likewise; both are reported in
	// Tokens mode only.
	FairGap, FairGapBound map[string]float64
	// TokensMode counts the dispatchers whose policy is in Tokens mode.
	TokensMode int
	// BytesPerToken is the smallest tiergate_bytes_per_token, the ratio
	// the dispatchers estimate prompts at (0: none reported).
	BytesPerToken float64
}

// tierSample is one tier summed over the dispatchers.
type tierSample struct {
	Queued, Bound, InFlight int
	TenantLimit             int // sum of the dispatchers' tenant concurrency limits
	TenantQueueLimit        int
	OldestAge               time.Duration
	Expired                 uint64
}

// histogram is a Prometheus histogram: cumulative counts per upper bound.
type histogram struct {
	Upper []float64
	Cum   []float64
	Count float64
	Sum   float64
}

func (h *histogram) add(o *dto.Histogram) {
	// The +Inf bucket is Count; quantile falls back to the last finite
	// bound above it, as histogram_quantile does.
	var finite []*dto.Bucket
	for _, b := range o.GetBucket() {
		if !math.IsInf(b.GetUpperBound(), 1) {
			finite = append(finite, b)
		}
	}
	if len(h.Upper) == 0 {
		for _, b := range finite {
			h.Upper = append(h.Upper, b.GetUpperBound())
			h.Cum = append(h.Cum, 0)
		}
	}
	for i, b := range finite {
		if i < len(h.Cum) && h.Upper[i] == b.GetUpperBound() {
			h.Cum[i] += float64(b.GetCumulativeCount())
		}
	}
	h.Count += float64(o.GetSampleCount())
	h.Sum += o.GetSampleSum()
}

// quantile estimates the q-quantile as Prometheus' histogram_quantile
// does: linear interpolation inside the bucket that holds it. NaN when
// empty; the highest finite bound when it falls in +Inf.
func (h *histogram) quantile(q float64) float64 {
	if h == nil || h.Count == 0 {
		return math.NaN()
	}
	rank := q * h.Count
	lower, below := 0.0, 0.0
	for i, upper := range h.Upper {
		if h.Cum[i] >= rank {
			in := h.Cum[i] - below
			if in <= 0 {
				return upper
			}
			return lower + (upper-lower)*(rank-below)/in
		}
		lower, below = upper, h.Cum[i]
	}
	return lower
}

// observer scrapes the dispatchers.
type observer struct {
	disps  []dispatcherRef
	token  string
	client *http.Client
	t0     time.Time

	mu       sync.Mutex
	samples  []sample
	policies map[string]*policy.Policy // by dispatcher
}

func newObserver(disps []dispatcherRef, token string) *observer {
	return &observer{disps: disps, token: token, policies: map[string]*policy.Policy{},
		client: &http.Client{Transport: newTransport(), Timeout: 900 * time.Millisecond}}
}

// setStart sets the time samples are measured from.
func (o *observer) setStart(t0 time.Time) {
	o.mu.Lock()
	o.t0 = t0
	o.mu.Unlock()
}

// run scrapes every period until ctx ends.
func (o *observer) run(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		o.scrape(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// latest is the last sample (OK or not) and whether there is one.
func (o *observer) latest() (sample, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.samples) == 0 {
		return sample{}, false
	}
	return o.samples[len(o.samples)-1], true
}

// all returns every sample taken.
func (o *observer) all() []sample {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]sample(nil), o.samples...)
}

type scraped struct {
	stats   dispatcher.Stats
	pol     *policy.Policy
	metrics map[string]*dto.MetricFamily
	ready   bool
	err     error
}

// scrape takes one sample and appends it.
func (o *observer) scrape(ctx context.Context) sample {
	o.mu.Lock()
	t0 := o.t0
	o.mu.Unlock()
	res := make([]scraped, len(o.disps))
	var wg sync.WaitGroup
	for i, d := range o.disps {
		wg.Add(1)
		go func() { defer wg.Done(); res[i] = o.scrapeOne(ctx, d) }()
	}
	wg.Wait()
	s := sample{T: time.Since(t0), OK: true, Tiers: map[string]tierSample{},
		Refused: map[string]map[string]float64{}, Responses: map[string]map[string]float64{}, Waits: map[string]*histogram{},
		FairGap: map[string]float64{}, FairGapBound: map[string]float64{}}
	if t0.IsZero() {
		s.T = -1 // before the load: not part of any chart
	}
	var errs []error
	for i, r := range res {
		if r.err != nil {
			s.OK = false
			errs = append(errs, fmt.Errorf("%s: %w", o.disps[i].Name, r.err))
			continue
		}
		if r.ready {
			s.Ready++
		}
		q := r.stats.Queue
		s.Slots += q.Slots
		s.InFlight += q.InFlight
		s.Queued += q.Queued
		s.Totals.Admitted += q.Totals.Admitted
		s.Totals.Dispatched += q.Totals.Dispatched
		s.Totals.Abandoned += q.Totals.Abandoned
		s.Totals.Expired += q.Totals.Expired
		s.Totals.Drained += q.Totals.Drained
		s.Versions = append(s.Versions, q.PolicyVersion)
		limits := map[string]policy.Tier{}
		if r.pol != nil {
			if r.pol.FairnessOf().Mode == policy.FairnessTokens {
				s.TokensMode++
			}
			if i == 0 {
				s.Backends = len(r.pol.Backends)
			}
			for _, t := range r.pol.Tiers {
				limits[t.Name] = t
			}
		}
		for name, t := range q.Tiers {
			if t.Retired {
				continue
			}
			ts := s.Tiers[name]
			ts.Queued += t.Queued
			ts.Bound += t.Bound
			ts.InFlight += t.InFlight
			ts.OldestAge = max(ts.OldestAge, t.OldestAge)
			ts.Expired += t.Expired
			ts.TenantLimit += limits[name].TenantConcurrencyLimit
			ts.TenantQueueLimit += limits[name].TenantQueueLimit
			s.Tiers[name] = ts
		}
		addMetrics(&s, r.metrics)
	}
	if len(errs) > 0 {
		s.Err = errors.Join(errs...).Error()
	}
	o.mu.Lock()
	o.samples = append(o.samples, s)
	o.mu.Unlock()
	return s
}

func addMetrics(s *sample, mfs map[string]*dto.MetricFamily) {
	for _, m := range mfs["tiergate_rejections_total"].GetMetric() {
		l := labels(m)
		if s.Refused[l["tier"]] == nil {
			s.Refused[l["tier"]] = map[string]float64{}
		}
		s.Refused[l["tier"]][l["cause"]] += m.GetCounter().GetValue()
	}
	for _, m := range mfs["tiergate_requests_total"].GetMetric() {
		l := labels(m)
		if s.Responses[l["tier"]] == nil {
			s.Responses[l["tier"]] = map[string]float64{}
		}
		s.Responses[l["tier"]][l["code"]] += m.GetCounter().GetValue()
	}
	for name, into := range map[string]map[string]float64{"tiergate_fairness_gap_tokens": s.FairGap, "tiergate_fairness_gap_bound_tokens": s.FairGapBound} {
		for _, m := range mfs[name].GetMetric() {
			tier := labels(m)["tier"]
			into[tier] = math.Max(into[tier], m.GetGauge().GetValue())
		}
	}
	for _, m := range mfs["tiergate_bytes_per_token"].GetMetric() {
		if v := m.GetGauge().GetValue(); v > 0 && (s.BytesPerToken == 0 || v < s.BytesPerToken) {
			s.BytesPerToken = v
		}
	}
	for _, m := range mfs["tiergate_queue_wait_seconds"].GetMetric() {
		tier := labels(m)["tier"]
		if s.Waits[tier] == nil {
			s.Waits[tier] = &histogram{}
		}
		s.Waits[tier].add(m.GetHistogram())
	}
}

func labels(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

func (o *observer) scrapeOne(ctx context.Context, d dispatcherRef) scraped {
	var r scraped
	if r.err = o.getJSON(ctx, d, "/v1/stats", &r.stats); r.err != nil {
		return r
	}
	o.mu.Lock()
	pol := o.policies[d.Name]
	o.mu.Unlock()
	if pol == nil || pol.Version != r.stats.Queue.PolicyVersion {
		var p policy.Policy
		if err := o.getJSON(ctx, d, "/v1/policy", &p); err == nil {
			pol = &p
			o.mu.Lock()
			o.policies[d.Name] = pol
			o.mu.Unlock()
		}
	}
	r.pol = pol
	r.ready = pol != nil && !r.stats.Draining
	body, err := o.get(ctx, d, "/metrics")
	if err != nil {
		r.err = err
		return r
	}
	defer body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	r.metrics, r.err = p.TextToMetricFamilies(body)
	return r
}

func (o *observer) get(ctx context.Context, d dispatcherRef, path string) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+d.Admin+path, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+o.token)
	resp, err := o.client.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		return nil, fmt.Errorf("GET %s: %d %s", path, resp.StatusCode, b)
	}
	return resp.Body, nil
}

func (o *observer) getJSON(ctx context.Context, d dispatcherRef, path string, v any) error {
	body, err := o.get(ctx, d, path)
	if err != nil {
		return err
	}
	defer body.Close()
	if err := json.NewDecoder(body).Decode(v); err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	return nil
}

// bounds are a sample's queue bounds per tier.
func bounds(s sample) map[string]int {
	out := map[string]int{}
	for t, ts := range s.Tiers {
		out[t] = ts.Bound
	}
	return out
}

// tenantLimits are a sample's tenant concurrency limits per tier.
func tenantLimits(s sample) map[string]int {
	out := map[string]int{}
	for t, ts := range s.Tiers {
		out[t] = ts.TenantLimit
	}
	return out
}
