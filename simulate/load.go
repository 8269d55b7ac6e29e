package simulate

import (
	"fmt"
	"sort"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// KindLoad is the kind of the simulator's own document. It shares the
// tiergate.dev/v1alpha1 apiVersion with the CRDs so that one file may hold
// all of them, but it is never applied to a cluster.
const KindLoad = "Load"

// Service-time distributions.
const (
	DistConstant    = "constant"
	DistExponential = "exponential"
	DistLognormal   = "lognormal"
)

// Arrival processes.
const (
	ProcPoisson  = "poisson"
	ProcConstant = "constant"
	ProcClosed   = "closed"
	ProcBurst    = "burst"
)

// defaultMaxRetries mirrors the OpenAI clients' default of two retries.
const defaultMaxRetries = 2

// Load is the traffic to simulate against the pool.
type Load struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              LoadSpec `json:"spec"`
}

// LoadSpec is the body of a Load document.
type LoadSpec struct {
	// Replicas is the number of ready replicas at the start.
	Replicas int32 `json:"replicas"`
	// ReplicaChanges are an autoscaler's moves: at that time the pool has
	// that many ready replicas and the bounds are recomputed.
	ReplicaChanges []ReplicaChange `json:"replicaChanges,omitempty"`
	// Duration is the simulated time, warm-up included.
	Duration metav1.Duration `json:"duration"`
	// Warmup is excluded from every figure.
	Warmup metav1.Duration `json:"warmup,omitempty"`
	// Seed makes the run reproducible; --seed overrides it.
	Seed uint64 `json:"seed,omitempty"`
	// ServiceTime is how long a dispatched request holds its slot. Omitted,
	// it is exponential with the pool's declared mean; refused when the
	// pool declares token rates, which then set it (pool_tokens.go).
	ServiceTime *ServiceTimeSpec `json:"serviceTime,omitempty"`
	// Tenants and their traffic.
	Tenants []TenantLoad `json:"tenants"`
	// Dispatchers is how many dispatcher pods share the pool (default 1).
	// In Local mode each gets its slice, as the controller splits it, and
	// attempts go to them round-robin; in Redis mode they act as one.
	Dispatchers *int32 `json:"dispatchers,omitempty"`
}

// MaxDispatchers bounds Load.spec.dispatchers: the simulator keeps state
// per tenant and dispatcher.
const MaxDispatchers = 1000

// dispatchers is spec.dispatchers, 1 when unset.
func (s *LoadSpec) dispatchers() int {
	if s.Dispatchers == nil {
		return 1
	}
	return int(*s.Dispatchers)
}

// ReplicaChange sets the ready replica count at a time.
type ReplicaChange struct {
	At       metav1.Duration `json:"at"`
	Replicas int32           `json:"replicas"`
}

// ServiceTimeSpec is a service-time distribution.
type ServiceTimeSpec struct {
	// Distribution is constant, exponential or lognormal.
	Distribution string `json:"distribution"`
	// Mean; omitted, the pool's declared serviceTime.mean.
	Mean *metav1.Duration `json:"mean,omitempty"`
	// Stddev is required for lognormal and refused otherwise.
	Stddev *metav1.Duration `json:"stddev,omitempty"`
}

// TenantLoad is one tenant's traffic.
type TenantLoad struct {
	// Tenant is matched to TenantQuotas; others get the pool's defaultTier.
	Tenant  string  `json:"tenant"`
	Arrival Arrival `json:"arrival"`
	// Timeout is how long the client waits for its answer (queue wait plus
	// service) before it gives up; 0 waits for ever.
	Timeout metav1.Duration `json:"timeout,omitempty"`
	// RetryOn429 retries refused requests after Retry-After.
	RetryOn429 bool `json:"retryOn429,omitempty"`
	// MaxRetries bounds the retries of one request (default 2).
	MaxRetries *int32 `json:"maxRetries,omitempty"`
	// PromptTokens is the prompt's tokens per request; omitted, 0.
	PromptTokens *TokenSpec `json:"promptTokens,omitempty"`
	// OutputTokens is the tokens an answer would generate; the backend
	// stops at the request's maximum. Omitted, 0, and the request
	// reserves no output (as an embedding).
	OutputTokens *TokenSpec `json:"outputTokens,omitempty"`
	// MaxTokens is the max_tokens every request names, with OutputTokens;
	// omitted, the requests name none and reserve the pool's
	// spec.tokens.defaultMaxTokens, as the dispatcher does.
	MaxTokens *int64 `json:"maxTokens,omitempty"`
}

// Arrival is a tenant's arrival process. Which fields apply depends on
// Process:
//   - poisson: rate (requests/s, exponential gaps);
//   - constant: rate (evenly spaced, random phase);
//   - closed: clients, each sending one request, waiting for its outcome,
//     thinking (exponential, mean think) and sending the next;
//   - burst: count requests at time at, spread evenly over spread (0: all at
//     the same instant), repeated every every (0: once).
type Arrival struct {
	Process string           `json:"process"`
	Rate    float64          `json:"rate,omitempty"`
	Clients int32            `json:"clients,omitempty"`
	Think   *metav1.Duration `json:"think,omitempty"`
	At      *metav1.Duration `json:"at,omitempty"`
	Count   int32            `json:"count,omitempty"`
	Spread  *metav1.Duration `json:"spread,omitempty"`
	Every   *metav1.Duration `json:"every,omitempty"`
}

// validate checks the spec on its own; the pool-dependent checks (tenant
// to tier mapping, default service-time mean) happen in resolve.
func (s *LoadSpec) validate() error {
	v := &loadErrors{}
	s.checkRun(v)
	s.checkReplicaChanges(v)
	s.checkServiceTime(v)
	s.checkTenants(v)
	if len(v.errs) > 0 {
		return fmt.Errorf("%w: %s", ErrInvalid, strings.Join(v.errs, "; "))
	}
	return nil
}

// loadErrors collects a Load's problems in the order they are found, each
// prefixed with its field path.
type loadErrors struct{ errs []string }

func (v *loadErrors) bad(field, format string, args ...any) {
	v.errs = append(v.errs, "spec."+field+": "+fmt.Sprintf(format, args...))
}

// checkRun checks the replicas, dispatchers, duration and warmup.
func (s *LoadSpec) checkRun(v *loadErrors) {
	if s.Replicas < 1 {
		v.bad("replicas", "must be at least 1, got %d", s.Replicas)
	}
	if n := s.Dispatchers; n != nil && (*n < 1 || *n > MaxDispatchers) {
		v.bad("dispatchers", "must be between 1 and %d, got %d", MaxDispatchers, *n)
	}
	d := s.Duration.Duration
	if d <= 0 {
		v.bad("duration", "must be greater than 0")
	}
	if s.Warmup.Duration < 0 || (d > 0 && s.Warmup.Duration >= d) {
		v.bad("warmup", "must be at least 0 and shorter than duration %s", d)
	}
}

// checkReplicaChanges checks that the changes are in order, within the run.
func (s *LoadSpec) checkReplicaChanges(v *loadErrors) {
	d := s.Duration.Duration
	prev := time.Duration(0)
	for i, c := range s.ReplicaChanges {
		f := fmt.Sprintf("replicaChanges[%d]", i)
		if c.At.Duration <= prev || (d > 0 && c.At.Duration >= d) {
			v.bad(f+".at", "must be after the previous change and before duration, got %s", c.At.Duration)
		}
		if c.Replicas < 0 {
			v.bad(f+".replicas", "must be at least 0, got %d", c.Replicas)
		}
		prev = c.At.Duration
	}
}

// checkServiceTime checks the optional service-time distribution.
func (s *LoadSpec) checkServiceTime(v *loadErrors) {
	st := s.ServiceTime
	if st == nil {
		return
	}
	switch st.Distribution {
	case DistConstant, DistExponential:
		if st.Stddev != nil {
			v.bad("serviceTime.stddev", "is only used by distribution lognormal")
		}
	case DistLognormal:
		if st.Stddev == nil || st.Stddev.Duration <= 0 {
			v.bad("serviceTime.stddev", "must be greater than 0 for distribution lognormal")
		}
	default:
		v.bad("serviceTime.distribution", "unknown distribution %q (want constant, exponential or lognormal)", st.Distribution)
	}
	if st.Mean != nil && st.Mean.Duration <= 0 {
		v.bad("serviceTime.mean", "must be greater than 0")
	}
}

// checkTenants checks each tenant's name, timeout, retries, arrivals and
// tokens.
func (s *LoadSpec) checkTenants(v *loadErrors) {
	if len(s.Tenants) == 0 {
		v.bad("tenants", "must list at least one tenant")
	}
	seen := map[string]bool{}
	for i, t := range s.Tenants {
		f := fmt.Sprintf("tenants[%d]", i)
		if t.Tenant == "" {
			v.bad(f+".tenant", "must not be empty")
		} else if seen[t.Tenant] {
			v.bad(f+".tenant", "duplicate tenant %q", t.Tenant)
		}
		seen[t.Tenant] = true
		if t.Timeout.Duration < 0 {
			v.bad(f+".timeout", "must be at least 0")
		}
		if t.MaxRetries != nil && *t.MaxRetries < 0 {
			v.bad(f+".maxRetries", "must be at least 0")
		}
		for _, e := range t.Arrival.check(s.Duration.Duration) {
			v.bad(f+".arrival."+e[0], "%s", e[1])
		}
		t.checkTokens(f, v)
	}
}

// check returns {field, problem} pairs.
func (a *Arrival) check(duration time.Duration) [][2]string {
	var out [][2]string
	bad := func(field, msg string) { out = append(out, [2]string{field, msg}) }
	var used []string
	switch a.Process {
	case ProcPoisson, ProcConstant:
		used = []string{"rate"}
		if !(a.Rate > 0) {
			bad("rate", "must be greater than 0 for process "+a.Process)
		}
	case ProcClosed:
		used = []string{"clients", "think"}
		a.checkClosed(bad)
	case ProcBurst:
		used = []string{"at", "count", "spread", "every"}
		a.checkBurst(duration, bad)
	default:
		bad("process", fmt.Sprintf("unknown process %q (want poisson, constant, closed or burst)", a.Process))
		return out
	}
	for _, f := range a.unusedFields(used) {
		bad(f, "is not used by process "+a.Process)
	}
	return out
}

func (a *Arrival) checkClosed(bad func(field, msg string)) {
	if a.Clients < 1 {
		bad("clients", "must be at least 1 for process closed")
	}
	if a.Think != nil && a.Think.Duration < 0 {
		bad("think", "must be at least 0")
	}
}

func (a *Arrival) checkBurst(duration time.Duration, bad func(field, msg string)) {
	if a.Count < 1 {
		bad("count", "must be at least 1 for process burst")
	}
	if a.At == nil || a.At.Duration < 0 || (duration > 0 && a.At.Duration >= duration) {
		bad("at", "must be set, at least 0 and before duration")
	}
	if a.Spread != nil && a.Spread.Duration < 0 {
		bad("spread", "must be at least 0")
	}
	if a.Every != nil && a.Every.Duration < 0 {
		bad("every", "must be at least 0")
	}
	if a.Every != nil && a.Every.Duration > 0 && a.Spread != nil && a.Spread.Duration > a.Every.Duration {
		bad("spread", "must not be longer than every")
	}
}

// unusedFields lists, sorted, the fields that are set but that the process
// does not read.
func (a *Arrival) unusedFields(used []string) []string {
	set := map[string]bool{
		"rate": a.Rate != 0, "clients": a.Clients != 0, "think": a.Think != nil,
		"at": a.At != nil, "count": a.Count != 0, "spread": a.Spread != nil, "every": a.Every != nil,
	}
	for _, f := range used {
		delete(set, f)
	}
	var extra []string
	for f, isSet := range set {
		if isSet {
			extra = append(extra, f)
		}
	}
	sort.Strings(extra)
	return extra
}

func (t *TenantLoad) maxRetries() int {
	if !t.RetryOn429 {
		return 0
	}
	if t.MaxRetries != nil {
		return int(*t.MaxRetries)
	}
	return defaultMaxRetries
}

func durOr(d *metav1.Duration, def time.Duration) time.Duration {
	if d == nil {
		return def
	}
	return d.Duration
}
