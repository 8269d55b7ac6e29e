package limitertest

import (
	"time"

	"github.com/google/go-cmp/cmp"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher/tokens"
)

// The cases' limits refill fast (6000 tokens a minute is 100 a second) so
// that a store on a real clock shows a refill within a few hundred
// milliseconds, and slowly where a refusal must outlast the Slack.
var (
	acme = tokens.Key{Pool: "ns/pool", Tenant: "acme"}
	beta = tokens.Key{Pool: "ns/pool", Tenant: "beta"}
	both = policy.Limits{RequestsPerMinute: 60, TokensPerMinute: 6000}
	tok  = policy.Limits{TokensPerMinute: 6000}
)

func caseNewBucketIsFull(s *suite) {
	d := s.reserve(acme, both, 100)
	s.ok("the first reservation", d)
	s.bucket("requests", d.Requests, 60, 59)
	s.bucket("tokens", d.Tokens, 6000, 5900)
	// A new bucket holds its whole limit.
	d = s.reserve(beta, both, 6000)
	s.ok("a first reservation of the whole limit", d)
	s.bucket("tokens", d.Tokens, 6000, 0)
}

func caseBothOrNeither(s *suite) {
	s.ok("draining the tokens", s.reserve(acme, both, 6000))
	d := s.reserve(acme, both, 1000)
	s.refused("the tokens refuse", d, tokens.BudgetTokens, false, 6000, 0, 1000)
	s.bucket("requests, not taken", d.Requests, 60, 59)
	s.bucket("tokens", d.Tokens, 6000, 0)

	one := policy.Limits{RequestsPerMinute: 1, TokensPerMinute: 6000}
	s.ok("the only request", s.reserve(beta, one, 10))
	d = s.reserve(beta, one, 10)
	s.refused("the requests refuse", d, tokens.BudgetRequests, false, 1, 0, 1)
	s.bucket("requests", d.Requests, 1, 0)
	s.bucket("tokens, not taken", d.Tokens, 6000, 5990)
}

func caseRefusals(s *suite) {
	s.ok("draining the tokens", s.reserve(acme, tok, 6000))
	d := s.reserve(acme, tok, 1000)
	s.refused("1000 tokens of an empty bucket", d, tokens.BudgetTokens, false, 6000, 0, 1000)
	s.bucket("tokens", d.Tokens, 6000, 0)

	d = s.reserve(acme, tok, 30)
	s.refused("30 tokens of an empty bucket", d, tokens.BudgetTokens, false, 6000, 0, 30)
	// Halfway there it still refuses, with the rest of the wait.
	half := d.RetryAfter / 2
	s.st.Sleep(half)
	level := rate(6000) * half.Seconds()
	d = s.reserve(acme, tok, 30)
	s.refused("30 tokens halfway", d, tokens.BudgetTokens, false, 6000, level, 30)
	// After RetryAfter the bucket holds them.
	s.st.Sleep(d.RetryAfter)
	level += rate(6000) * d.RetryAfter.Seconds()
	d = s.reserve(acme, tok, 30)
	s.ok("30 tokens after RetryAfter", d)
	s.bucket("tokens", d.Tokens, 6000, level-30)
}

func caseRequestsFirst(s *suite) {
	// 2 requests and 60 tokens a minute: one request per 30s, a token per
	// second.
	l := policy.Limits{RequestsPerMinute: 2, TokensPerMinute: 60}
	s.ok("the first half", s.reserve(acme, l, 30))
	s.ok("the second half", s.reserve(acme, l, 30))
	d := s.reserve(acme, l, 40)
	// Both refuse: the requests budget is named, the wait is the longer
	// one (40 tokens take 40s, a request 30s).
	s.refused("both refuse, tokens wait longer", d, tokens.BudgetRequests, false, 60, 0, 40)
	d = s.reserve(acme, l, 10)
	s.refused("both refuse, the request waits longer", d, tokens.BudgetRequests, false, 2, 0, 1)
	s.bucket("requests", d.Requests, 2, 0)
	s.bucket("tokens", d.Tokens, 60, 0)
}

func caseNever(s *suite) {
	d := s.reserve(acme, both, 6001)
	s.refused("more than the whole limit", d, tokens.BudgetTokens, true, 6000, 6000, 6001)
	s.bucket("requests, not taken", d.Requests, 60, 60)
	s.bucket("tokens, not taken", d.Tokens, 6000, 6000)

	// Never wins over an empty requests bucket: no wait makes it fit.
	one := policy.Limits{RequestsPerMinute: 1, TokensPerMinute: 6000}
	s.ok("the only request", s.reserve(beta, one, 0))
	d = s.reserve(beta, one, 6001)
	s.refused("more than the whole limit, no request left", d, tokens.BudgetTokens, true, 6000, 6000, 6001)

	// Exactly the limit fits a full bucket, so it is not Never.
	k := tokens.Key{Pool: "ns/pool", Tenant: "gamma"}
	s.ok("100 tokens", s.reserve(k, both, 100))
	d = s.reserve(k, both, 6000)
	s.refused("the whole limit, 100 tokens short", d, tokens.BudgetTokens, false, 6000, 5900, 6000)
}

func caseSettle(s *suite) {
	s.ok("1000 tokens", s.reserve(acme, tok, 1000))
	d := s.settle(acme, tok, tokens.Settlement{Reserved: 1000, Used: 400})
	s.bucket("600 unused tokens given back", d.Tokens, 6000, 5600)
	s.bucket("requests (no budget)", d.Requests, 0, 0)

	d = s.settle(acme, tok, tokens.Settlement{Reserved: 0, Used: 5700})
	s.bucket("5700 tokens more than reserved: below 0", d.Tokens, 6000, -100)
	d = s.reserve(acme, tok, 50)
	s.refused("50 tokens of a bucket below 0", d, tokens.BudgetTokens, false, 6000, -100, 50)
	d = s.reserve(acme, tok, 0)
	s.refused("even 0 tokens of a bucket below 0", d, tokens.BudgetTokens, false, 6000, -100, 0)

	d = s.settle(acme, tok, tokens.Settlement{Reserved: 100_000, Used: 0})
	s.bucket("a settlement caps at the limit", d.Tokens, 6000, 6000)

	// One settlement takes at most two windows' worth, and a bucket owes at
	// most one window: it is full again two windows later, whatever it
	// held, so a store may forget it then.
	d = s.settle(acme, tok, tokens.Settlement{Reserved: 0, Used: 100_000})
	s.bucket("a settlement takes at most two windows' worth", d.Tokens, 6000, -6000)
	d = s.settle(acme, tok, tokens.Settlement{Reserved: 0, Used: 10})
	s.bucket("a bucket owes at most one window", d.Tokens, 6000, -6000)
}

func caseNegativeCounts(s *suite) {
	d := s.reserve(acme, both, -5)
	s.ok("a negative reservation", d)
	s.bucket("requests", d.Requests, 60, 59)
	s.bucket("tokens, none taken", d.Tokens, 6000, 6000)
	s.ok("1000 tokens", s.reserve(acme, both, 1000))
	d = s.settle(acme, both, tokens.Settlement{Reserved: -5, Used: -10})
	s.bucket("negative counts settle nothing", d.Tokens, 6000, 5000)
	d = s.settle(acme, both, tokens.Settlement{Reserved: -5, Used: 100})
	s.bucket("a negative reservation settles as 0", d.Tokens, 6000, 4900)
}

func caseRefundRequest(s *suite) {
	// 2 requests a minute: one per 30s.
	l := policy.Limits{RequestsPerMinute: 2, TokensPerMinute: 6000}
	s.ok("the first request", s.reserve(acme, l, 100))
	d := s.settle(acme, l, tokens.Settlement{Reserved: 100, Used: 100, RefundRequest: true})
	s.bucket("the request given back", d.Requests, 2, 2)
	s.bucket("tokens, all used", d.Tokens, 6000, 5900)

	s.ok("the second request", s.reserve(acme, l, 100))
	s.ok("the third request", s.reserve(acme, l, 100))
	d = s.reserve(acme, l, 100)
	s.refused("no request left", d, tokens.BudgetRequests, false, 2, 0, 1)

	// A request that never reached a backend gives everything back.
	d = s.settle(acme, l, tokens.Settlement{Reserved: 100, Used: 0, RefundRequest: true})
	s.bucket("requests after a whole refund", d.Requests, 2, 1)
	s.bucket("tokens after a whole refund", d.Tokens, 6000, 5800)
	s.ok("the refunded request's place", s.reserve(acme, l, 100))

	for range 3 {
		d = s.settle(acme, l, tokens.Settlement{RefundRequest: true})
	}
	s.bucket("refunds cap at the limit", d.Requests, 2, 2)
}

func caseLoweredLimit(s *suite) {
	lower := policy.Limits{TokensPerMinute: 3000}
	s.ok("1000 tokens", s.reserve(acme, tok, 1000))
	d := s.reserve(acme, lower, 0)
	s.ok("0 tokens under a lower limit", d)
	s.bucket("the level capped at the lower limit", d.Tokens, 3000, 3000)
	d = s.reserve(acme, tok, 0)
	s.ok("0 tokens under the higher limit again", d)
	s.bucket("a higher limit does not refill", d.Tokens, 6000, 3000)
}

func caseNoBudget(s *suite) {
	d := s.reserve(acme, policy.Limits{}, 1_000_000)
	if diff := cmp.Diff(tokens.Decision{OK: true}, d); diff != "" {
		s.t.Errorf("Reserve without a budget (-want +got):\n%s", diff)
	}
	d = s.settle(acme, policy.Limits{}, tokens.Settlement{Reserved: 5, Used: 1_000_000, RefundRequest: true})
	if diff := cmp.Diff(tokens.Decision{OK: true}, d); diff != "" {
		s.t.Errorf("Settle without a budget (-want +got):\n%s", diff)
	}

	reqs := policy.Limits{RequestsPerMinute: 60}
	d = s.reserve(beta, reqs, 1_000_000)
	s.ok("any tokens without a tokens budget", d)
	s.bucket("requests", d.Requests, 60, 59)
	s.bucket("tokens (no budget)", d.Tokens, 0, 0)

	k := tokens.Key{Pool: "ns/pool", Tenant: "gamma"}
	d = s.reserve(k, tok, 10)
	s.ok("tokens without a requests budget", d)
	s.bucket("requests (no budget)", d.Requests, 0, 0)
	s.bucket("tokens", d.Tokens, 6000, 5990)

	// A budget added later starts full; the other keeps its level.
	d = s.reserve(beta, both, 100)
	s.ok("beta with a tokens budget too", d)
	s.bucket("requests kept", d.Requests, 60, 58)
	s.bucket("the new tokens bucket, full before", d.Tokens, 6000, 5900)
}

func caseHeaderValues(s *suite) {
	d := s.settle(acme, both, tokens.Settlement{})
	s.bucket("a new tenant's requests", d.Requests, 60, 60)
	s.bucket("a new tenant's tokens", d.Tokens, 6000, 6000)
	if d.Requests.Reset != 0 || d.Tokens.Reset != 0 {
		s.t.Errorf("full buckets reset in %s and %s, want 0", d.Requests.Reset, d.Tokens.Reset)
	}
	d = s.reserve(acme, both, 6000)
	s.ok("the whole limit", d)
	s.bucket("requests", d.Requests, 60, 59)
	s.bucket("tokens, empty", d.Tokens, 6000, 0)

	// 255ms refill 25.5 tokens (shown as 25) and 0.255 requests.
	s.st.Sleep(255 * time.Millisecond)
	d = s.settle(acme, both, tokens.Settlement{})
	s.bucket("requests refilling", d.Requests, 60, 59.255)
	s.bucket("tokens refilling", d.Tokens, 6000, 25.5)
	d = s.settle(acme, both, tokens.Settlement{Reserved: 0, Used: 1000})
	s.bucket("tokens below 0 show 0", d.Tokens, 6000, -974.5)
}

func caseIndependentKeys(s *suite) {
	ks := []tokens.Key{
		{Pool: "ns/pool", Tenant: "beta"},
		{Pool: "ns/other", Tenant: "acme"},
		{Pool: "ns/{pool}", Tenant: "acme"},
		{Pool: "ns/pool", Tenant: "acme:budget"},
		{Pool: "ns/pool:budget:acme", Tenant: "x"},
	}
	s.ok("draining acme", s.reserve(acme, tok, 6000))
	for _, k := range ks {
		d := s.reserve(k, tok, 1000)
		s.ok(k.Pool+" "+k.Tenant, d)
		s.bucket(k.Pool+" "+k.Tenant, d.Tokens, 6000, 5000)
	}
	d := s.reserve(acme, tok, 1000)
	s.refused("acme is still empty", d, tokens.BudgetTokens, false, 6000, 0, 1000)
}

func caseShared(s *suite) {
	s.ok("4000 tokens on the first", s.reserveOn(0, acme, both, 4000))
	d := s.reserveOn(1, acme, both, 3000)
	s.refused("3000 tokens on the second", d, tokens.BudgetTokens, false, 6000, 2000, 3000)
	s.bucket("the second sees the first's request", d.Requests, 60, 59)
	d = s.reserveOn(2, acme, both, 2000)
	s.ok("2000 tokens on the third", d)
	s.bucket("tokens", d.Tokens, 6000, 0)
	d = s.settleOn(1, acme, both, tokens.Settlement{Reserved: 4000, Used: 1000})
	s.bucket("settled on the second", d.Tokens, 6000, 3000)
	d = s.reserveOn(0, acme, both, 3000)
	s.ok("what the settlement gave back, on the first", d)
	s.bucket("requests of all three", d.Requests, 60, 57)
}
