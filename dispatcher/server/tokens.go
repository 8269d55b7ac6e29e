package server

import (
	"context"
	"net/http"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher/apierror"
	"github.com/tiergate/tiergate/dispatcher/identity"
	"github.com/tiergate/tiergate/dispatcher/queue"
	"github.com/tiergate/tiergate/dispatcher/tokens"
)

// tokenReq is one request's token accounting (docs/tokens.md): its
// estimated cost, its tenant's budgets and the latest Decision on them,
// and the Meter that watches a 2xx answer on its way to the client.
type tokenReq struct {
	cost   tokens.Cost
	key    tokens.Key
	limits policy.Limits
	// budget: the tenant has one, so Reserve and Settle are asked and
	// every answer carries dec's x-ratelimit-* headers.
	budget bool
	dec    tokens.Decision
	// open: reserved and not settled yet (settleTokens ends it, once).
	open bool
	// reached: an attempt reached a backend, so the request is charged
	// what it used rather than refunded.
	reached bool
	meter   *tokens.Meter // of a 2xx answer, set as its head goes out
	// queued is the request's queue handle once admitted: settleTokens
	// corrects its tenant's fairness counter from what it used.
	queued *queue.Handle
	// spare is the Meter kept with the pooled exchange, Reset for each
	// answer (it keeps only small buffers).
	spare *tokens.Meter
}

// budgets are the tenants' Limits under one policy: each listed tenant's
// own (LimitsOf its entry and tier) and those of the default tier, which
// unlisted tenants get.
type budgets struct {
	tenants map[string]policy.Limits
	unknown policy.Limits
}

func budgetsOf(p *policy.Policy) budgets {
	tiers := make(map[string]*policy.Tier, len(p.Tiers))
	for i := range p.Tiers {
		tiers[p.Tiers[i].Name] = &p.Tiers[i]
	}
	b := budgets{tenants: make(map[string]policy.Limits, len(p.Tenants)), unknown: policy.LimitsOf(nil, tiers[p.DefaultTier])}
	for i := range p.Tenants {
		tn := &p.Tenants[i]
		b.tenants[tn.ID] = policy.LimitsOf(tn, tiers[tn.Tier])
	}
	return b
}

func (b budgets) of(tenant string) policy.Limits {
	if l, ok := b.tenants[tenant]; ok {
		return l
	}
	return b.unknown
}

// reserve estimates the request's cost and, when its tenant has a budget,
// takes the reservation from it. ok is false when the request is refused
// (429 rate_limited at once, never queued, or 503 unavailable when the
// budgets cannot be read) or its client left. Once ok, settleTokens must
// follow.
func (s *Server) reserve(x *exchange, r *http.Request, st *state, who identity.Identity, body []byte) (outcome, bool) {
	t := &x.tok
	if !s.estimate(r, st, body, &t.cost) {
		return clientGone(""), false
	}
	t.limits = st.budgets.of(who.Tenant)
	x.sw.tok = t // meters the answer; sets the headers when budget
	if t.limits.IsZero() {
		t.open = true
		return outcome{}, true
	}
	t.key = tokens.Key{Pool: st.pool, Tenant: who.Tenant}
	d, err := s.lim.Reserve(r.Context(), t.key, t.limits, t.cost.Reservation())
	switch {
	case err != nil && r.Context().Err() != nil:
		return clientGone(""), false
	case err != nil:
		// No decision, so no x-ratelimit-* headers on the refusal.
		return refused(apierror.BudgetsUnavailable(who.Tier, err)), false
	}
	t.budget, t.dec = true, d
	if !d.OK {
		return refused(apierror.RateLimited(who.Tenant, who.Tier, d, t.cost.Reservation())), false
	}
	t.open = true
	return outcome{}, true
}

// largeBody is the body size from which estimates take turns.
const largeBody = 64 << 10

// estimate sets c to the cost of body. Decoding a prompt with
// encoding/json copies it (the raw member, then the string) while the
// body itself is still held, so many large bodies estimated at once would
// hold a few times the bodies the budget allows. Large ones therefore take
// turns, GOMAXPROCS at a time (the work is all CPU, so no more could run
// anyway), which bounds that extra memory to a few × GOMAXPROCS ×
// MaxBodyBytes. It is false when the client left while waiting its turn.
func (s *Server) estimate(r *http.Request, st *state, body []byte, c *tokens.Cost) bool {
	if len(body) >= largeBody {
		select {
		case s.estimating <- struct{}{}:
			defer func() { <-s.estimating }()
		case <-r.Context().Done():
			return false
		}
	}
	*c = tokens.Estimate(r.URL.Path, body, s.ratio.Value(), st.maxTokens)
	return true
}

// settleTokens ends an open reservation, once, however the request ended.
// A request that never reached a backend (refused by the queue, expired,
// abandoned before dispatch, no backend, every backend unreachable) gives
// it all back, the request included; any other is charged what it used.
// It runs before the exit writes a refusal, so the refusal's headers show
// the budget after the refund.
func (s *Server) settleTokens(x *exchange, r *http.Request) {
	t := &x.tok
	if !t.open {
		return
	}
	t.open = false
	set := tokens.Settlement{Reserved: t.cost.Reservation(), RefundRequest: !t.reached}
	var prompt, completion int64
	if t.reached {
		prompt, completion = s.used(x)
		set.Used = prompt + completion
	}
	if t.queued != nil {
		// A request that never reached a backend used nothing, so its
		// tenant's counter gives back what its dispatch charged.
		t.queued.Settle(prompt, completion)
		t.queued = nil
	}
	if !t.budget {
		return
	}
	// The client may be gone; the settlement is still owed.
	d, err := s.lim.Settle(context.WithoutCancel(r.Context()), t.key, t.limits, set)
	if err != nil {
		s.cfg.Log.V(1).Info("settling a reservation failed", "pool", t.key.Pool, "reserved", set.Reserved, "used", set.Used, "err", err.Error())
		return
	}
	t.dec = d
}

// used is what a request that reached a backend used, by the Meter of its
// 2xx answer (its usage, else the prompt estimate and the content chunks
// streamed) or, for any other end, the prompt estimate. It counts
// tokens_total and, from a reported usage, teaches the pool's Ratio and
// observes how far the estimate was off. It returns prompt and completion
// tokens.
func (s *Server) used(x *exchange) (int64, int64) {
	t := &x.tok
	prompt, completion, fromUsage := t.cost.Prompt, int64(0), false
	if t.meter != nil {
		prompt, completion, fromUsage = t.meter.Used(t.cost)
	}
	se := s.series(x)
	se.Tokens(prompt, completion)
	if fromUsage && prompt > 0 && t.cost.PromptBytes > 0 {
		// Only prompt text is estimated (token ids and other bodies are
		// not learnt from). The error is that of the estimate this
		// request reserved with, before the Ratio learns from it.
		se.ObserveEstimateError(float64(t.cost.Prompt) / float64(prompt))
		s.ratio.Observe(t.cost.PromptBytes, prompt)
	}
	return prompt, completion
}

// head is called once, as the final head of an answer goes out (a
// refusal's too). For a tenant with a budget it sets the x-ratelimit-*
// headers of the latest Decision, replacing any the backend sent: the
// dispatcher's budgets are the ones this client is held to, and a
// backend's (an upstream provider's, say) would contradict them. A 2xx
// answer gets a Meter.
func (t *tokenReq) head(h http.Header, code int) {
	if t.budget {
		setBudgetHeaders(h, t.dec)
	}
	if code >= 200 && code < 300 && t.open {
		if t.spare == nil {
			t.spare = tokens.NewMeter(h.Get("Content-Type"))
		} else {
			t.spare.Reset(h.Get("Content-Type"))
		}
		t.meter = t.spare
	}
}

// budgetHeaders maps every x-ratelimit-* name tokens.Headers gives to its
// canonical form, worked out once: http.Header's Set and Del would
// canonicalise (and allocate) for each name of each answer.
var budgetHeaders = func() map[string]string {
	m := map[string]string{}
	for _, n := range []string{
		tokens.HeaderLimitRequests, tokens.HeaderRemainingRequests, tokens.HeaderResetRequests,
		tokens.HeaderLimitTokens, tokens.HeaderRemainingTokens, tokens.HeaderResetTokens,
	} {
		m[n] = http.CanonicalHeaderKey(n)
	}
	return m
}()

// setBudgetHeaders replaces h's x-ratelimit-* headers with d's, the values
// sharing one backing array.
func setBudgetHeaders(h http.Header, d tokens.Decision) {
	for _, c := range budgetHeaders {
		delete(h, c)
	}
	kv := tokens.Headers(d)
	vals := make([]string, len(kv))
	for i, p := range kv {
		vals[i] = p[1]
		h[budgetHeaders[p[0]]] = vals[i : i+1 : i+1]
	}
}

// BytesPerToken is the pool's learned prompt bytes per token.
func (s *Server) BytesPerToken() float64 { return s.ratio.Value() }
