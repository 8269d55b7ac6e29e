// Package capacitytest builds the seed's worked example (docs/architecture.md#the-bounds)
// as API objects, for the tests of capacity and of its callers. It holds
// no state; every call returns fresh objects.
package capacitytest

import (
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tiergate/tiergate/api/v1alpha1"
)

// Namespace and PoolName name the seed's pool.
const (
	Namespace = "default"
	PoolName  = "llm"
)

// Duration returns d as the API's duration pointer.
func Duration(d time.Duration) *metav1.Duration { return &metav1.Duration{Duration: d} }

// Pool is the seed's pool: C=4, S=6s, starvation bound 120s, defaultTier
// free, Deployment "vllm" (its R, 6 in the seed, is passed separately).
// Every defaulted field is set, as the API server would. mut runs in order.
func Pool(mut ...func(*v1alpha1.ModelPool)) *v1alpha1.ModelPool {
	p := &v1alpha1.ModelPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: PoolName},
		Spec: v1alpha1.ModelPoolSpec{
			DeploymentRef:         v1alpha1.LocalObjectReference{Name: "vllm"},
			ConcurrencyPerReplica: 4,
			ServiceTime:           v1alpha1.ServiceTime{Mean: metav1.Duration{Duration: 6 * time.Second}, Source: v1alpha1.ServiceTimeDeclared},
			Ageing:                v1alpha1.Ageing{StarvationBound: Duration(120 * time.Second)},
			Backend:               v1alpha1.Backend{Port: 8000, Scheme: "http"},
			Dispatchers:           v1alpha1.Dispatchers{AdminPort: 9090},
			Authentication:        v1alpha1.Authentication{Mode: v1alpha1.AuthTrustedHeader, HeaderName: "X-Tenant-ID"},
			SharedState:           v1alpha1.SharedStateLocal,
			DefaultTier:           "free",
			ExemptPaths:           []string{"/health"},
		},
	}
	for _, m := range mut {
		m(p)
	}
	return p
}

// WithClientTimeout sets spec.clientTimeout; the seed's is 30s.
func WithClientTimeout(d time.Duration) func(*v1alpha1.ModelPool) {
	return func(p *v1alpha1.ModelPool) { p.Spec.ClientTimeout = Duration(d) }
}

// WithColdStart sets spec.coldStart, how long a first replica takes to be
// Ready when the pool is at zero.
func WithColdStart(d time.Duration) func(*v1alpha1.ModelPool) {
	return func(p *v1alpha1.ModelPool) { p.Spec.ColdStart = Duration(d) }
}

// WithAutoscaling sets spec.autoscaling; util "" leaves targetUtilization
// to its default.
func WithAutoscaling(minReplicas, maxReplicas int32, util string) func(*v1alpha1.ModelPool) {
	return func(p *v1alpha1.ModelPool) {
		a := &v1alpha1.Autoscaling{MinReplicas: minReplicas, MaxReplicas: maxReplicas}
		if util != "" {
			q := resource.MustParse(util)
			a.TargetUtilization = &q
		}
		p.Spec.Autoscaling = a
	}
}

// Tier is a ServiceTier of the seed's pool.
func Tier(name string, base int32, wait time.Duration, share string) v1alpha1.ServiceTier {
	return v1alpha1.ServiceTier{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: name},
		Spec: v1alpha1.ServiceTierSpec{
			PoolRef:       v1alpha1.LocalObjectReference{Name: PoolName},
			BasePriority:  base,
			TolerableWait: metav1.Duration{Duration: wait},
			TenantShare:   resource.MustParse(share),
		},
	}
}

// Tiers are the seed's three tiers, deliberately out of order (free,
// premium, standard): the bounds come out sorted by base priority.
func Tiers() []v1alpha1.ServiceTier {
	return []v1alpha1.ServiceTier{
		Tier("free", 20, 60*time.Second, "0.04"),
		Tier("premium", 0, 5*time.Second, "0.25"),
		Tier("standard", 10, 20*time.Second, "0.10"),
	}
}

// Quota is a TenantQuota in the seed's namespace; maxConc may be nil.
func Quota(name, tenant, tier string, maxConc *int32) v1alpha1.TenantQuota {
	return v1alpha1.TenantQuota{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: name},
		Spec:       v1alpha1.TenantQuotaSpec{Tenant: tenant, TierRef: v1alpha1.LocalObjectReference{Name: tier}, MaxConcurrency: maxConc},
	}
}
