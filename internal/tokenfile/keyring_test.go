package tokenfile

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestKeyringMatch(t *testing.T) {
	t0 := time.Unix(1000, 0)
	const grace = 30 * time.Second
	rotated := func() Keyring {
		var k Keyring
		k.Rotate([]byte("old-token"), t0.Add(-time.Hour), grace)
		k.Rotate([]byte("new-token"), t0, grace)
		return k
	}
	tests := map[string]struct {
		ring Keyring
		tok  string
		at   time.Duration // after t0
		want bool
	}{
		"empty ring refuses anything":        {Keyring{}, "x", 0, false},
		"empty ring refuses the empty token": {Keyring{}, "", 0, false},
		"the new token":                      {rotated(), "new-token", 0, true},
		"the new token long after":           {rotated(), "new-token", time.Hour, true},
		"the old token at the rotation":      {rotated(), "old-token", 0, true},
		"the old token within the grace":     {rotated(), "old-token", grace - time.Nanosecond, true},
		"the old token when the grace ends":  {rotated(), "old-token", grace, false},
		"the old token after the grace":      {rotated(), "old-token", time.Hour, false},
		"a wrong token within the grace":     {rotated(), "other", 0, false},
		"a prefix of the new token":          {rotated(), "new-tok", 0, false},
		"the new token with a suffix":        {rotated(), "new-token ", 0, false},
		"the empty token":                    {rotated(), "", 0, false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := tc.ring.Match([]byte(tc.tok), t0.Add(tc.at)); got != tc.want {
				t.Errorf("Match(%q) at t0+%s = %v, want %v", tc.tok, tc.at, got, tc.want)
			}
		})
	}
}

func TestKeyringRotate(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var k Keyring
	type view struct{ Cur, Prev string }
	tokens := func(at time.Duration) view {
		c, p := k.Tokens(t0.Add(at))
		return view{string(c), string(p)}
	}
	steps := []struct {
		name    string
		tok     string
		at      time.Duration
		changed bool
		want    view
	}{
		{"an empty token is no token", "", 0, false, view{}},
		{"the first token", "a", 0, true, view{Cur: "a"}},
		{"the same token again", "a", time.Second, false, view{Cur: "a"}},
		{"a rotation keeps the old one for the grace", "b", 2 * time.Second, true, view{Cur: "b", Prev: "a"}},
		{"a second rotation within the grace drops the first", "c", 3 * time.Second, true, view{Cur: "c", Prev: "b"}},
		{"back to an earlier token", "b", 4 * time.Second, true, view{Cur: "b", Prev: "c"}},
	}
	for _, s := range steps {
		if got := k.Rotate([]byte(s.tok), t0.Add(s.at), 10*time.Second); got != s.changed {
			t.Errorf("%s: Rotate = %v, want %v", s.name, got, s.changed)
		}
		if diff := cmp.Diff(s.want, tokens(s.at)); diff != "" {
			t.Errorf("%s: tokens (-want +got):\n%s", s.name, diff)
		}
	}
	if got := k.GraceEnds(); !got.Equal(t0.Add(14 * time.Second)) {
		t.Errorf("GraceEnds = %s, want t0+14s", got)
	}
	if diff := cmp.Diff(view{Cur: "b"}, tokens(14*time.Second)); diff != "" {
		t.Errorf("tokens once the grace ended (-want +got):\n%s", diff)
	}
	if (&Keyring{}).GraceEnds() != (time.Time{}) {
		t.Error("an empty ring has a grace end")
	}
}

// Match's cost for a token that matches and one that does not: both hash
// the presented token once and compare it with both sums.
func BenchmarkKeyringMatch(b *testing.B) {
	var k Keyring
	t0 := time.Unix(1000, 0)
	k.Rotate([]byte("old-token-0123456789abcdef0123456789"), t0, MaxGrace)
	k.Rotate([]byte("new-token-0123456789abcdef0123456789"), t0, MaxGrace)
	for name, tok := range map[string][]byte{
		"current": []byte("new-token-0123456789abcdef0123456789"),
		"wrong":   []byte("bad-token-0123456789abcdef0123456789"),
	} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				k.Match(tok, t0)
			}
		})
	}
}
