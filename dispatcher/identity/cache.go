package identity

import (
	"slices"
	"sync"
	"time"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

// tokenCache remembers verified tokens until their exp, keyed on the whole
// token string: only the very same token, signature included, hits. It is
// bounded: when full, an arbitrary entry makes room (Go's map iteration
// starts at a random place), which costs O(1) and cannot be steered by the
// order in which clients send tokens.
type tokenCache struct {
	mu      sync.Mutex
	max     int
	entries map[string]cachedToken
}

type cachedToken struct {
	tenant string
	exp    time.Time
}

func newTokenCache(max int) *tokenCache {
	return &tokenCache{max: max, entries: make(map[string]cachedToken)}
}

// get is the tenant of token when it is cached and now is before its exp.
func (c *tokenCache) get(token string, now time.Time) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[token]
	if !ok {
		return "", false
	}
	if !now.Before(e.exp) {
		delete(c.entries, token)
		return "", false
	}
	return e.tenant, true
}

// put caches a token verified at now; one already past its exp (accepted
// within the leeway) is not kept.
func (c *tokenCache) put(token, tenant string, exp, now time.Time) {
	if c.max <= 0 || !now.Before(exp) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.entries[token]; !ok && len(c.entries) >= c.max {
		for k := range c.entries {
			delete(c.entries, k)
			break
		}
	}
	c.entries[token] = cachedToken{tenant: tenant, exp: exp}
}

func (c *tokenCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

// keyIDLog holds the most recent distinct key IDs that tokens named and
// the JWKS lacked, at most policy.MaxUnknownKeyIDs of them, each at most
// policy.MaxKeyIDLen bytes (a longer one can match no key of a valid
// policy, so it is not worth a refetch).
type keyIDLog struct {
	mu  sync.Mutex
	ids []string // oldest first
}

func (l *keyIDLog) record(kid string) {
	if len(kid) > policy.MaxKeyIDLen {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if i := slices.Index(l.ids, kid); i >= 0 {
		l.ids = slices.Delete(l.ids, i, i+1)
	}
	l.ids = append(l.ids, kid)
	if len(l.ids) > policy.MaxUnknownKeyIDs {
		l.ids = slices.Delete(l.ids, 0, len(l.ids)-policy.MaxUnknownKeyIDs)
	}
}

func (l *keyIDLog) list() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.ids) == 0 {
		return nil
	}
	out := slices.Clone(l.ids)
	slices.Sort(out)
	return out
}
