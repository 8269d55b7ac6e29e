package controller

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/internal/testutil"
)

// The samples in Tokens fairness, bounded by tokens at 2000 prompt and 50
// output tokens per slot-second, with acme of weight 3, reach both
// dispatchers: r = 3 × 2000 × 50 / 2050 = 146.341 weighted tokens per
// slot-second, premium's 5s hold 24 × r × 5 = 17560 over the pool, 8780 on
// each dispatcher's 12 slots; free's 60s are capped at the 30s timeout.
func TestTokenFairnessAndBoundsReachTheDispatchers(t *testing.T) {
	e, backends := sampleEnv(t, 2, func(s string) string {
		return replaceOnce(t, s, "  defaultTier: free\n", "  defaultTier: free\n  fairness:\n    mode: Tokens\n"+
			"  tokens:\n    boundBy: Tokens\n    prefillTokensPerSecond: 2000\n    decodeTokensPerSecond: 50\n")
	})
	ctx := context.Background()
	var acme v1alpha1.TenantQuota
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: "acme"}, &acme); err != nil {
		t.Fatal(err)
	}
	acme.Spec.Weight = 3
	if err := k8s.Update(ctx, &acme); err != nil {
		t.Fatal(err)
	}
	want := samplePolicy(e.ns, backends, 12, []policy.Tier{
		{Name: "premium", BasePriority: 0, TolerableWaitSeconds: 5, QueueBound: 10, TenantConcurrencyLimit: 3, TenantQueueLimit: 2, QueueTokenBound: 8780, TenantQueueTokenLimit: 2195},
		{Name: "standard", BasePriority: 10, TolerableWaitSeconds: 20, QueueBound: 40, TenantConcurrencyLimit: 1, TenantQueueLimit: 4, QueueTokenBound: 35121, TenantQueueTokenLimit: 3512},
		{Name: "free", BasePriority: 20, TolerableWaitSeconds: 60, QueueBound: 60, TenantConcurrencyLimit: 1, TenantQueueLimit: 2, QueueTokenBound: 52682, TenantQueueTokenLimit: 2107},
	}, []policy.Tenant{{ID: "acme", Tier: "premium", Weight: 3}, {ID: "globex", Tier: "standard"}, {ID: "initech", Tier: "free"}})
	want.Fairness = &policy.Fairness{Mode: policy.FairnessTokens, InputWeight: 1, OutputWeight: 2}
	want.Tokens = &policy.Tokens{DefaultMaxTokens: policy.DefaultMaxTokens}
	want.TokenServiceRate = 12 * 300000.0 / 2050
	if took, err := allHold(e.disp, 5*time.Second, matches(want)); err != nil {
		t.Fatalf("after %s not every dispatcher holds the token policy: %v", took, err)
	}
	testutil.Eventually(t, 3*time.Second, "the tiers' status in tokens", func() error {
		if rate := e.pool().Status.TokenRate; rate != "146.341" {
			return fmt.Errorf("pool status.tokenRate %q, want 146.341", rate)
		}
		for name, b := range map[string][2]int64{"premium": {17560, 4390}, "standard": {70243, 7024}, "free": {105365, 4214}} {
			var st v1alpha1.ServiceTier
			if err := k8s.Get(ctx, types.NamespacedName{Namespace: e.ns, Name: name}, &st); err != nil {
				return err
			}
			if got := [2]int64{st.Status.QueueTokenBound, st.Status.TenantQueueTokenLimit}; got != b {
				return fmt.Errorf("%s status queueTokenBound/tenantQueueTokenLimit %v, want %v", name, got, b)
			}
		}
		return nil
	})
}
