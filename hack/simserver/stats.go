package main

import (
	"sync"
)

// maxArrivals bounds the arrival log so a long benchmark cannot grow it.
const maxArrivals = 10000

// stats counts what tests assert on. "Active" is a request inside the
// server (queued in its FIFO or generating): that is what the dispatcher's
// per-tenant limit bounds.
type stats struct {
	mu      sync.Mutex
	overall counters
	tenants map[string]*counters
	// arrivals is the order in which requests reached the server, by tenant.
	arrivals []arrival
}

type counters struct {
	Active         int   `json:"active"`
	PeakActive     int   `json:"peakActive"`
	Generating     int   `json:"generating"`
	PeakGenerating int   `json:"peakGenerating"`
	Requests       int64 `json:"requests"`
	Completed      int64 `json:"completed"`
	// Cancelled counts requests whose client left before the answer was
	// complete, CancelledQueued those of them still in the FIFO.
	Cancelled       int64 `json:"cancelled"`
	CancelledQueued int64 `json:"cancelledQueued"`
	// PromptTokens counts the prompts of requests that reached a
	// generation slot, CompletionTokens the tokens delivered (all of an
	// answer, or what was streamed before the client left).
	PromptTokens     int64 `json:"promptTokens"`
	CompletionTokens int64 `json:"completionTokens"`
}

type arrival struct {
	Tenant    string `json:"tenant"`
	RequestID string `json:"requestId,omitempty"`
}

type snapshot struct {
	counters
	Tenants  map[string]counters `json:"tenants"`
	Arrivals []arrival           `json:"arrivals"`
}

func newStats() *stats { return &stats{tenants: map[string]*counters{}} }

func (s *stats) each(tenant string, f func(c *counters)) {
	f(&s.overall)
	c := s.tenants[tenant]
	if c == nil {
		c = &counters{}
		s.tenants[tenant] = c
	}
	f(c)
}

func (s *stats) arrive(tenant, requestID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.arrivals) < maxArrivals {
		s.arrivals = append(s.arrivals, arrival{Tenant: tenant, RequestID: requestID})
	}
	s.each(tenant, func(c *counters) {
		c.Requests++
		c.Active++
		c.PeakActive = max(c.PeakActive, c.Active)
	})
}

func (s *stats) startGenerating(tenant string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.each(tenant, func(c *counters) {
		c.Generating++
		c.PeakGenerating = max(c.PeakGenerating, c.Generating)
	})
}

// leave records the end of a request. generating says whether it held a
// generation slot; cancelled whether its client went away first; prompt
// and completion are its tokens.
func (s *stats) leave(tenant string, generating, cancelled bool, prompt, completion int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.each(tenant, func(c *counters) {
		c.Active--
		if generating {
			c.Generating--
			c.PromptTokens += int64(prompt)
			c.CompletionTokens += int64(completion)
		}
		switch {
		case cancelled && !generating:
			c.Cancelled++
			c.CancelledQueued++
		case cancelled:
			c.Cancelled++
		default:
			c.Completed++
		}
	})
}

func (s *stats) snapshot() snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := snapshot{counters: s.overall, Tenants: make(map[string]counters, len(s.tenants)), Arrivals: append([]arrival{}, s.arrivals...)}
	for k, v := range s.tenants {
		out.Tenants[k] = *v
	}
	return out
}

// reset zeroes the counts but keeps the current Active/Generating numbers
// (those requests are still running) as the new peaks.
func (s *stats) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	zero := func(c *counters) *counters {
		return &counters{Active: c.Active, PeakActive: c.Active, Generating: c.Generating, PeakGenerating: c.Generating}
	}
	s.overall = *zero(&s.overall)
	for k, v := range s.tenants {
		if v.Active == 0 {
			delete(s.tenants, k)
			continue
		}
		s.tenants[k] = zero(v)
	}
	s.arrivals = nil
}
