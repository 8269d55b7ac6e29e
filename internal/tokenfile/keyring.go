package tokenfile

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"time"
)

// MaxGrace is the longest a replaced token is still accepted.
const MaxGrace = 60 * time.Second

// Keyring is the current token and the one it replaced, which counts until
// prevUntil. The zero value holds no token and matches nothing.
type Keyring struct {
	cur, prev       []byte
	curSum, prevSum [sha256.Size]byte
	prevUntil       time.Time
}

// Rotate makes tok the current token at now; the current one is accepted
// until now+grace. It reports false, and changes nothing, when tok is
// already the current token or empty.
func (k *Keyring) Rotate(tok []byte, now time.Time, grace time.Duration) bool {
	if len(tok) == 0 || bytes.Equal(tok, k.cur) {
		return false
	}
	if len(k.cur) > 0 {
		k.prev, k.prevSum, k.prevUntil = k.cur, k.curSum, now.Add(grace)
	}
	k.cur = bytes.Clone(tok)
	k.curSum = sha256.Sum256(k.cur)
	return true
}

// Match reports whether tok is the current token, or the replaced one
// before its grace ends. Both comparisons always run, on SHA-256 sums, so
// the time taken says neither which token matched nor how long they are.
func (k *Keyring) Match(tok []byte, now time.Time) bool {
	sum := sha256.Sum256(tok)
	cur := subtle.ConstantTimeCompare(sum[:], k.curSum[:]) & flag(len(k.cur) > 0 && len(tok) > 0)
	prev := subtle.ConstantTimeCompare(sum[:], k.prevSum[:]) & flag(k.inGrace(now) && len(tok) > 0)
	return cur|prev == 1
}

// Tokens are the current token (nil when none) and the replaced one while
// its grace lasts (else nil). The caller must not modify them.
func (k *Keyring) Tokens(now time.Time) (cur, prev []byte) {
	if k.inGrace(now) {
		prev = k.prev
	}
	return k.cur, prev
}

// GraceEnds is when the replaced token stops counting; zero when there is
// none.
func (k *Keyring) GraceEnds() time.Time {
	if len(k.prev) == 0 {
		return time.Time{}
	}
	return k.prevUntil
}

func (k *Keyring) inGrace(now time.Time) bool {
	return len(k.prev) > 0 && now.Before(k.prevUntil)
}

func flag(b bool) int {
	if b {
		return 1
	}
	return 0
}
