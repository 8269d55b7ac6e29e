package controllers

import (
	"context"
	"math"
	"net"
	"sort"
	"strconv"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/capacity"
)

// observed is everything read for one reconcile.
type observed struct {
	deployment  *appsv1.Deployment // nil when it does not exist
	tiers       []v1alpha1.ServiceTier
	quotas      []v1alpha1.TenantQuota
	hashes      map[string][]string // quota name -> key hashes
	secretState map[string]secretState
	backends    []policy.Backend
	dispatchers []corev1.Pod
	jwks        jwksReading // JWT mode
	// excluded says, per dispatcher (in Local mode), why it holds no share
	// of the slots: "" for one that holds its share (see dispatcherhealth.go).
	excluded []string
}

type secretState struct {
	name       string
	missing    bool
	unlabelled bool     // it exists without APIKeysLabel: not read
	keys       []string // requested keys absent from the Secret
}

// observe reads everything the pool's bounds depend on, from the cache.
func (r *PoolReconciler) observe(ctx context.Context, pool *v1alpha1.ModelPool) (*observed, error) {
	obs := &observed{hashes: map[string][]string{}, secretState: map[string]secretState{}}
	var err error
	if obs.deployment, err = r.deployment(ctx, pool); err != nil {
		return nil, err
	}
	if obs.tiers, obs.quotas, err = r.tiersAndQuotas(ctx, pool); err != nil {
		return nil, err
	}
	if err := r.readAPIKeys(ctx, pool.Namespace, obs); err != nil {
		return nil, err
	}
	if obs.jwks, err = r.readJWKS(ctx, pool); err != nil {
		return nil, err
	}
	if obs.backends, err = r.backends(ctx, pool, obs.deployment); err != nil {
		return nil, err
	}
	if obs.dispatchers, err = r.dispatcherPods(ctx, pool); err != nil {
		return nil, err
	}
	return obs, nil
}

// boundsInput is what ComputeBounds needs of the observations. The ready
// replicas R are the backends listed, at most the Deployment's
// status.readyReplicas: the slots and the backends of a policy then come
// from the same list of pods, so no policy has more slots than its
// backends serve. The Deployment's count lags its pods (30-220 ms on a
// real cluster): it still counts a pod whose deletion began, which the
// list has dropped, and it does not count yet one that just turned Ready,
// which then waits for it (the safe side).
func (obs *observed) boundsInput(pool *v1alpha1.ModelPool, serviceTime time.Duration) capacity.BoundsInput {
	var ready int32
	if obs.deployment != nil {
		ready = min(obs.deployment.Status.ReadyReplicas, int32(min(len(obs.backends), math.MaxInt32)))
	} else if pool.Spec.ColdStart != nil {
		// Without the Deployment no first replica is coming: refuse, as
		// without a cold start, instead of holding requests for nothing.
		pool = pool.DeepCopy()
		pool.Spec.ColdStart = nil
	}
	return capacity.BoundsInput{
		Pool:                pool,
		ReadyReplicas:       ready,
		Tiers:               obs.tiers,
		Quotas:              obs.quotas,
		Dispatchers:         len(obs.dispatchers),
		Excluded:            obs.excludedMarks(),
		ObservedServiceTime: serviceTime,
		Backends:            obs.backends,
		APIKeyHashes:        obs.hashes,
		JWKS:                obs.jwks.Keys,
	}
}

// excludedMarks are obs.excluded as ComputeBounds takes them; nil when no
// dispatcher is excluded.
func (obs *observed) excludedMarks() []bool {
	var marks []bool
	for i, why := range obs.excluded {
		if why != "" {
			if marks == nil {
				marks = make([]bool, len(obs.dispatchers))
			}
			marks[i] = true
		}
	}
	return marks
}

// deployment is the pool's model Deployment, nil when it does not exist.
func (r *PoolReconciler) deployment(ctx context.Context, pool *v1alpha1.ModelPool) (*appsv1.Deployment, error) {
	var dep appsv1.Deployment
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: pool.Namespace, Name: pool.Spec.DeploymentRef.Name}, &dep); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	return &dep, nil
}

// tiersAndQuotas lists the pool's tiers and the quotas of each tier.
func (r *PoolReconciler) tiersAndQuotas(ctx context.Context, pool *v1alpha1.ModelPool) ([]v1alpha1.ServiceTier, []v1alpha1.TenantQuota, error) {
	var tiers v1alpha1.ServiceTierList
	if err := r.Client.List(ctx, &tiers, client.InNamespace(pool.Namespace), client.MatchingFields{indexTierPool: pool.Name}); err != nil {
		return nil, nil, err
	}
	var quotas []v1alpha1.TenantQuota
	for _, t := range tiers.Items {
		var list v1alpha1.TenantQuotaList
		if err := r.Client.List(ctx, &list, client.InNamespace(pool.Namespace), client.MatchingFields{indexQuotaTier: t.Name}); err != nil {
			return nil, nil, err
		}
		quotas = append(quotas, list.Items...)
	}
	return tiers.Items, quotas, nil
}

// readAPIKeys hashes the keys of every quota's Secret into obs and notes
// Secrets that are missing or unlabelled and keys that are missing.
func (r *PoolReconciler) readAPIKeys(ctx context.Context, ns string, obs *observed) error {
	for _, q := range obs.quotas {
		ref := q.Spec.APIKeySecretRef
		if ref == nil {
			continue
		}
		hashes, st, err := r.readAPIKeySecret(ctx, ns, ref)
		if err != nil {
			return err
		}
		if hashes != nil {
			obs.hashes[q.Name] = hashes
		}
		obs.secretState[q.Name] = st
	}
	return nil
}

// backends are the Ready pods the Deployment selects that are neither
// terminating nor finished, by address; pods of every ReplicaSet count
// (during a rolling update the old and the new serve alike).
func (r *PoolReconciler) backends(ctx context.Context, pool *v1alpha1.ModelPool, dep *appsv1.Deployment) ([]policy.Backend, error) {
	if dep == nil || dep.Spec.Selector == nil {
		return nil, nil
	}
	pods, err := r.selectedPods(ctx, pool.Namespace, dep.Spec.Selector)
	if err != nil {
		return nil, err
	}
	var out []policy.Backend
	seen := map[string]bool{}
	for i := range pods {
		p := &pods[i]
		if !podServing(p) || !podReady(p) {
			continue
		}
		addr := net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(pool.Spec.Backend.Port)))
		if !seen[addr] {
			seen[addr] = true
			out = append(out, policy.Backend{Address: addr, Scheme: pool.Spec.Backend.Scheme})
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Address < out[b].Address })
	return out, nil
}

// dispatcherPods are the pods the pool's dispatcher selector matches that
// have an IP, Ready or not (a fresh one becomes Ready only once it holds a
// policy), newest first, then by name. Slots are handed out in this order,
// so when there are fewer than pods the newest hold them: during a rolling
// update the new pods get slots, become Ready and let the rollout go on,
// while the old ones report NotReady and are replaced.
func (r *PoolReconciler) dispatcherPods(ctx context.Context, pool *v1alpha1.ModelPool) ([]corev1.Pod, error) {
	pods, err := r.selectedPods(ctx, pool.Namespace, &pool.Spec.Dispatchers.Selector)
	if err != nil {
		return nil, err
	}
	var out []corev1.Pod
	for i := range pods {
		if podServing(&pods[i]) {
			out = append(out, pods[i])
		}
	}
	sort.Slice(out, func(a, b int) bool {
		ta, tb := out[a].CreationTimestamp, out[b].CreationTimestamp
		if !ta.Equal(&tb) {
			return tb.Before(&ta)
		}
		return out[a].Name < out[b].Name
	})
	return out, nil
}

// dispatcherFacts are what the health rules need of the dispatcher pods,
// in their order.
func (obs *observed) dispatcherFacts() []dispatcherFacts {
	out := make([]dispatcherFacts, len(obs.dispatchers))
	for i := range obs.dispatchers {
		out[i] = factsOf(&obs.dispatchers[i])
	}
	return out
}

// selectedPods lists the pods of ns that sel selects, shared with the
// informer's cache (never write to them); an empty selector
// selects none.
func (r *PoolReconciler) selectedPods(ctx context.Context, ns string, sel *metav1.LabelSelector) ([]corev1.Pod, error) {
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil || s.Empty() {
		return nil, err
	}
	var pods corev1.PodList
	// The cache's own objects, not copies: every caller only reads them.
	// Copying 1,000 model pods took a quarter of the controller's CPU
	// during a scale (docs/benchmarks.md, "Cluster scale").
	if err := r.Client.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabelsSelector{Selector: s}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	return pods.Items, nil
}

// podServing is true for a pod with an IP that is neither terminating nor
// finished.
func podServing(p *corev1.Pod) bool {
	return p.Status.PodIP != "" && p.DeletionTimestamp == nil &&
		p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func podRestarts(p *corev1.Pod) int32 {
	var n int32
	for _, c := range p.Status.ContainerStatuses {
		n += c.RestartCount
	}
	return n
}

// dispatcherTargets pairs the sorted dispatcher pods with their policies,
// stamped with version.
func dispatcherTargets(pods []corev1.Pod, adminPort int32, policies []policy.Policy, version int64) []Target {
	out := make([]Target, 0, len(pods))
	for i := range pods {
		p := &pods[i]
		pol := policies[i]
		pol.Version = version
		out = append(out, Target{
			UID:      p.UID,
			Name:     p.Name,
			Address:  net.JoinHostPort(p.Status.PodIP, strconv.Itoa(int(adminPort))),
			Ready:    podReady(p),
			Restarts: podRestarts(p),
			Policy:   pol,
		})
	}
	return out
}

// selectorMatches reports whether sel selects the labels; an empty or
// invalid selector selects nothing.
func selectorMatches(sel *metav1.LabelSelector, l map[string]string) bool {
	if sel == nil {
		return false
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil || s.Empty() {
		return false
	}
	return s.Matches(labels.Set(l))
}
