package admin

import (
	"crypto/sha256"
	"crypto/subtle"
)

// Tokens decides whether a presented bearer token opens the /v1 endpoints.
// A tokenfile.Follower is one: it follows a rotated token file and still
// accepts the replaced token for a grace. Verify must be safe for
// concurrent use and compare in constant time.
type Tokens interface {
	Verify(token []byte) bool
}

// staticToken is one fixed token (Config.Token).
type staticToken [sha256.Size]byte

// Verify compares SHA-256 sums, so neither the content nor the length
// leaks through timing.
func (s *staticToken) Verify(token []byte) bool {
	got := sha256.Sum256(token)
	return subtle.ConstantTimeCompare(got[:], s[:]) == 1
}

// tokensOf is what the handler checks tokens with; nil when the /v1
// endpoints are disabled.
func tokensOf(cfg Config) Tokens {
	switch {
	case cfg.Tokens != nil:
		return cfg.Tokens
	case len(cfg.Token) > 0:
		s := staticToken(sha256.Sum256(cfg.Token))
		return &s
	}
	return nil
}
