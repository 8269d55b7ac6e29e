package v1

import (
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
)

// FieldError is one violation, located by its JSON field path such as
// "tiers[1].queueBound".
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

func (e FieldError) Error() string { return e.Field + ": " + e.Message }

// ValidationErrors lists every violation of a Policy, in document order.
// Match it with errors.As.
type ValidationErrors []FieldError

func (v ValidationErrors) Error() string {
	parts := make([]string, len(v))
	for i, e := range v {
		parts[i] = e.Error()
	}
	return "policy: invalid: " + strings.Join(parts, "; ")
}

type checker struct{ errs ValidationErrors }

func (c *checker) add(field, format string, args ...any) {
	c.errs = append(c.errs, FieldError{Field: field, Message: fmt.Sprintf(format, args...)})
}

func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }

// Validate checks the whole document and returns every violation as
// ValidationErrors, or nil. slots == 0 with no backends is valid: the pool
// has been scaled to zero and the queue refuses with ErrNoCapacity, or,
// with coldStartSeconds, holds requests for its first replica. With slots
// 0 a tier's queueBound may be 0.
func (p *Policy) Validate() error {
	if p == nil {
		return ValidationErrors{{Field: "", Message: "policy is missing"}}
	}
	var c checker
	c.pool(p)
	c.authentication(p.Authentication)
	c.exemptPaths(p.ExemptPaths)
	tiers := c.tiers(p.Tiers)
	if p.DefaultTier != "" {
		if _, ok := tiers[p.DefaultTier]; !ok {
			c.add("defaultTier", "names unknown tier %q", p.DefaultTier)
		}
	}
	c.tenants(p.Tenants, tiers)
	c.backends(p.Backends)
	c.coldStart(p)
	c.tokens(p.Tokens)
	c.fairness(p.Fairness)
	if !finite(p.TokenServiceRate) || p.TokenServiceRate < 0 {
		c.add("tokenServiceRate", "must be a finite number >= 0, got %v", p.TokenServiceRate)
	}
	if len(c.errs) == 0 {
		return nil
	}
	return c.errs
}

// pool checks the pool-wide numbers.
func (c *checker) pool(p *Policy) {
	if p.SchemaVersion < 0 {
		c.add("schemaVersion", "must be >= 0, got %d", p.SchemaVersion)
	}
	if p.Version < 0 {
		c.add("version", "must be >= 0, got %d", p.Version)
	}
	if p.Slots < 0 {
		c.add("slots", "must be >= 0, got %d", p.Slots)
	}
	if p.Slots > 0 && len(p.Backends) == 0 {
		c.add("slots", "is %d but there are no backends; slots must be 0 when the pool has no backends", p.Slots)
	}
	if !finite(p.ServiceRate) || p.ServiceRate < 0 {
		c.add("serviceRate", "must be a finite number >= 0, got %v", p.ServiceRate)
	}
	if !finite(p.AgeingRate) || p.AgeingRate <= 0 {
		c.add("ageingRate", "must be a finite number > 0, got %v", p.AgeingRate)
	}
	if !finite(p.ClientTimeoutSeconds) || p.ClientTimeoutSeconds < 0 {
		c.add("clientTimeoutSeconds", "must be a finite number >= 0 (0 disables expiry), got %v", p.ClientTimeoutSeconds)
	}
	switch p.SharedState {
	case "", StateLocal, StateRedis:
	default:
		c.add("sharedState", "must be %q or %q, got %q", StateLocal, StateRedis, p.SharedState)
	}
}

func (c *checker) exemptPaths(paths []string) {
	for i, path := range paths {
		if !strings.HasPrefix(path, "/") {
			c.add(fmt.Sprintf("exemptPaths[%d]", i), "must start with '/', got %q", path)
		}
	}
}

// tiers checks every tier and returns the index of each distinct name.
func (c *checker) tiers(ts []Tier) map[string]int {
	names := map[string]int{}
	if len(ts) == 0 {
		c.add("tiers", "at least one tier is required")
	}
	for i, t := range ts {
		f := fmt.Sprintf("tiers[%d]", i)
		if t.Name == "" {
			c.add(f+".name", "is required")
		} else if j, dup := names[t.Name]; dup {
			c.add(f+".name", "duplicate tier name %q (also tiers[%d])", t.Name, j)
		} else {
			names[t.Name] = i
		}
		if t.BasePriority < 0 {
			c.add(f+".basePriority", "must be >= 0, got %d", t.BasePriority)
		}
		if !finite(t.TolerableWaitSeconds) || t.TolerableWaitSeconds <= 0 {
			c.add(f+".tolerableWaitSeconds", "must be a finite number > 0, got %v", t.TolerableWaitSeconds)
		}
		if t.QueueBound < 1 {
			c.add(f+".queueBound", "must be >= 1, got %d", t.QueueBound)
		}
		if t.TenantConcurrencyLimit < 1 {
			c.add(f+".tenantConcurrencyLimit", "must be >= 1, got %d", t.TenantConcurrencyLimit)
		}
		if t.TenantQueueLimit < 1 {
			c.add(f+".tenantQueueLimit", "must be >= 1, got %d", t.TenantQueueLimit)
		}
		c.limits(f+".tenantLimits", t.TenantLimits)
		c.tokenBounds(f, t)
	}
	return names
}

// tenants checks every tenant against the tiers, and that no API key hash
// is listed twice anywhere.
func (c *checker) tenants(tns []Tenant, tiers map[string]int) {
	ids := map[string]int{}
	hashes := map[string]string{}
	for i, tn := range tns {
		f := fmt.Sprintf("tenants[%d]", i)
		if tn.ID == "" {
			c.add(f+".id", "is required")
		} else if j, dup := ids[tn.ID]; dup {
			c.add(f+".id", "duplicate tenant id %q (also tenants[%d])", tn.ID, j)
		} else {
			ids[tn.ID] = i
		}
		if tn.Tier == "" {
			c.add(f+".tier", "is required")
		} else if _, ok := tiers[tn.Tier]; !ok {
			c.add(f+".tier", "names unknown tier %q", tn.Tier)
		}
		if tn.MaxConcurrency < 0 {
			c.add(f+".maxConcurrency", "must be >= 1 when set, got %d", tn.MaxConcurrency)
		}
		c.keyHashes(f, tn.APIKeySHA256, hashes)
		c.limits(f+".limits", tn.Limits)
		if tn.Weight < 0 {
			c.add(f+".weight", "must be >= 1 when set, got %d", tn.Weight)
		}
	}
}

// tokenBounds checks a tier's token bounds: each > 0 when set, and a
// tenant's share only beside a tier's bound.
func (c *checker) tokenBounds(f string, t Tier) {
	if t.QueueTokenBound < 0 {
		c.add(f+".queueTokenBound", "must be >= 1 when set, got %d", t.QueueTokenBound)
	}
	switch {
	case t.TenantQueueTokenLimit < 0:
		c.add(f+".tenantQueueTokenLimit", "must be >= 1 when set, got %d", t.TenantQueueTokenLimit)
	case t.TenantQueueTokenLimit > 0 && t.QueueTokenBound == 0:
		c.add(f+".tenantQueueTokenLimit", "is set without queueTokenBound")
	}
}

// fairness checks the fairness mode and weights.
func (c *checker) fairness(fr *Fairness) {
	if fr == nil {
		return
	}
	switch fr.Mode {
	case "", FairnessRequests, FairnessTokens:
	default:
		c.add("fairness.mode", "must be %q or %q, got %q", FairnessRequests, FairnessTokens, fr.Mode)
	}
	if fr.InputWeight < 0 {
		c.add("fairness.inputWeight", "must be >= 1 when set, got %d", fr.InputWeight)
	}
	if fr.OutputWeight < 0 {
		c.add("fairness.outputWeight", "must be >= 1 when set, got %d", fr.OutputWeight)
	}
}

// limits checks one set of budgets: each is > 0 when given, and a set
// that gives neither is a mistake rather than "no budget".
func (c *checker) limits(f string, l *Limits) {
	if l == nil {
		return
	}
	if l.RequestsPerMinute < 0 {
		c.add(f+".requestsPerMinute", "must be >= 1 when set, got %d", l.RequestsPerMinute)
	}
	if l.TokensPerMinute < 0 {
		c.add(f+".tokensPerMinute", "must be >= 1 when set, got %d", l.TokensPerMinute)
	}
	if l.IsZero() {
		c.add(f, "sets neither requestsPerMinute nor tokensPerMinute")
	}
}

// tokens checks the token accounting.
func (c *checker) tokens(t *Tokens) {
	if t != nil && t.DefaultMaxTokens < 0 {
		c.add("tokens.defaultMaxTokens", "must be >= 1 when set, got %d", t.DefaultMaxTokens)
	}
}

// keyHashes checks one tenant's key hashes; seen maps every hash met so
// far to its field.
func (c *checker) keyHashes(tenantField string, hs []string, seen map[string]string) {
	for k, h := range hs {
		hf := fmt.Sprintf("%s.apiKeySHA256[%d]", tenantField, k)
		if !isSHA256Hex(h) {
			if len(h) != 64 {
				c.add(hf, "must be 64 lower-case hex digits (a SHA-256), got %d characters", len(h))
			} else {
				c.add(hf, "must be 64 lower-case hex digits (a SHA-256), got %q at offset %d", h[badHex(h)], badHex(h))
			}
			continue
		}
		if other, dup := seen[h]; dup {
			c.add(hf, "duplicate API key hash (also %s)", other)
			continue
		}
		seen[h] = hf
	}
}

func (c *checker) backends(bs []Backend) {
	addrs := map[string]int{}
	for i, b := range bs {
		f := fmt.Sprintf("backends[%d]", i)
		if msg := checkAddress(b.Address); msg != "" {
			c.add(f+".address", "%s", msg)
		} else if j, dup := addrs[b.Address]; dup {
			c.add(f+".address", "duplicate backend %q (also backends[%d])", b.Address, j)
		} else {
			addrs[b.Address] = i
		}
		switch b.Scheme {
		case "", "http", "https":
		default:
			c.add(f+".scheme", "must be \"http\" or \"https\", got %q", b.Scheme)
		}
	}
}

func isSHA256Hex(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		ch := s[i]
		if (ch < '0' || ch > '9') && (ch < 'a' || ch > 'f') {
			return false
		}
	}
	return true
}

// badHex is the offset of the first character that is not lower-case hex.
func badHex(s string) int {
	for i := 0; i < len(s); i++ {
		if ch := s[i]; (ch < '0' || ch > '9') && (ch < 'a' || ch > 'f') {
			return i
		}
	}
	return -1
}

// checkAddress returns "" for a usable host:port, else why not.
func checkAddress(a string) string {
	if a == "" {
		return "is required"
	}
	if strings.Contains(a, "://") {
		return fmt.Sprintf("must be host:port without a scheme, got %q", a)
	}
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return fmt.Sprintf("must be host:port, got %q", a)
	}
	if host == "" {
		return fmt.Sprintf("has an empty host in %q", a)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return fmt.Sprintf("has port %q; want 1-65535", port)
	}
	return ""
}
