package controllers

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"testing"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

// scalePolicies are the policies of the cluster scale figure: 20
// dispatchers, 1,000 backends and 200 tenants with a key each.
func scalePolicies() []policy.Policy {
	backends := make([]policy.Backend, 0, 1000)
	for i := range 1000 {
		backends = append(backends, policy.Backend{Address: fmt.Sprintf("127.90.%d.%d:8000", i/250, i%250)})
	}
	tenants := make([]policy.Tenant, 0, 200)
	for i := range 200 {
		tenants = append(tenants, policy.Tenant{ID: fmt.Sprintf("tenant-%03d", i), Tier: "standard", MaxConcurrency: 3,
			APIKeySHA256: []string{fmt.Sprintf("%064x", i)}})
	}
	out := make([]policy.Policy, 0, 20)
	for i := range 20 {
		out = append(out, policy.Policy{Version: int64(i + 1), Pool: "scale/llm", Slots: 10, ServiceRate: 1.6, AgeingRate: 6,
			Tiers:   []policy.Tier{{Name: "premium", QueueBound: 10}, {Name: "standard", QueueBound: 40}},
			Tenants: tenants, Backends: backends})
	}
	return out
}

// bufferedHash is contentHash as it was, each policy marshalled into a
// buffer of its own: the baseline of BenchmarkContentHash.
func bufferedHash(policies []policy.Policy) string {
	h := sha256.New()
	for _, p := range policies {
		p.Version = 0
		b, _ := json.Marshal(p)
		h.Write(b)
		h.Write([]byte{'\n'})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// The hash is the one the buffered form gave (an upgraded controller does
// not take unchanged policies for new content) and ignores the version.
func TestContentHash(t *testing.T) {
	p := scalePolicies()
	if got, want := contentHash(p), bufferedHash(p); got != want {
		t.Errorf("contentHash %s, the buffered form %s", got, want)
	}
	q := scalePolicies()
	for i := range q {
		q[i].Version += 100
	}
	if contentHash(p) != contentHash(q) {
		t.Error("the versions changed the hash")
	}
	q[3].Slots++
	if contentHash(p) == contentHash(q) {
		t.Error("one policy's slots did not change the hash")
	}
}

func BenchmarkContentHash(b *testing.B) {
	p := scalePolicies()
	for name, hash := range map[string]func([]policy.Policy) string{"buffered": bufferedHash, "encoder": contentHash} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				hash(p)
			}
		})
	}
}
