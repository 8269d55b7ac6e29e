package identity

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

func TestTokenCache(t *testing.T) {
	t0 := time.Unix(1000, 0)
	c := newTokenCache(3)
	c.put("a", "acme", t0.Add(time.Minute), t0)
	c.put("late", "acme", t0, t0) // at its exp already: not kept
	if got, ok := c.get("a", t0.Add(59*time.Second)); !ok || got != "acme" {
		t.Errorf("get before exp = %q, %v", got, ok)
	}
	if _, ok := c.get("late", t0); ok {
		t.Error("a token accepted past its exp was cached")
	}
	if _, ok := c.get("a", t0.Add(time.Minute)); ok {
		t.Error("hit at exp")
	}
	if c.len() != 0 {
		t.Errorf("an expired entry stays: %d entries", c.len())
	}
	for i := 0; i < 10; i++ {
		c.put(fmt.Sprint(i), "t", t0.Add(time.Hour), t0)
		if c.len() > 3 {
			t.Fatalf("%d entries, bound 3", c.len())
		}
	}
	if got, ok := c.get("9", t0); !ok || got != "t" {
		t.Errorf("the newest entry was evicted: %q, %v", got, ok)
	}
}

func TestKeyIDLog(t *testing.T) {
	var l keyIDLog
	if l.list() != nil {
		t.Error("empty log lists something")
	}
	for i := 0; i < policy.MaxUnknownKeyIDs+4; i++ {
		l.record(fmt.Sprintf("k%02d", i))
	}
	l.record(string(make([]byte, policy.MaxKeyIDLen+1))) // can match no key: not kept
	ids := func(from, to int, more ...string) []string {
		var out []string
		for i := from; i <= to; i++ {
			out = append(out, fmt.Sprintf("k%02d", i))
		}
		return append(out, more...)
	}
	if diff := cmp.Diff(ids(4, 19), l.list()); diff != "" {
		t.Errorf("the newest 16 (-want +got)\n%s", diff)
	}
	l.record("k04") // seen again: now the newest
	l.record("z1")  // drops k05, the oldest
	if diff := cmp.Diff(append([]string{"k04"}, ids(6, 19, "z1")...), l.list()); diff != "" {
		t.Errorf("after a repeat (-want +got)\n%s", diff)
	}
}
