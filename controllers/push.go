package controllers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

// PushResult classifies one push attempt. Its values are the result label
// of tiergate_push_total.
type PushResult string

// Push results.
const (
	PushOK           PushResult = "success"
	PushUnauthorized PushResult = "unauthorized"  // 401 or 403: wrong or missing token
	PushRejected     PushResult = "rejected"      // 400: the dispatcher found the policy invalid
	PushConflict     PushResult = "conflict"      // 409 stale_version: the dispatcher holds a newer version
	PushPoolMismatch PushResult = "pool_mismatch" // 409 pool_mismatch: the dispatcher holds another pool's policy
	PushUnreachable  PushResult = "unreachable"   // no HTTP answer within the timeout
	PushFailed       PushResult = "error"         // any other answer (another 409 too), or no token to send
)

// Sentinel errors of a push attempt; PodState.Err wraps one of them.
var (
	ErrPushUnauthorized = errors.New("dispatcher refused the push token")
	ErrPushRejected     = errors.New("dispatcher rejected the policy")
	ErrPushConflict     = errors.New("dispatcher holds a newer policy version")
	ErrPushPoolMismatch = errors.New("dispatcher holds another pool's policy")
	ErrPushUnreachable  = errors.New("dispatcher unreachable")
	ErrPushFailed       = errors.New("push failed")
)

// Target is one dispatcher pod and the policy it should hold.
type Target struct {
	UID  types.UID
	Name string
	// Address is the pod's admin API as host:port.
	Address string
	// Ready and Restarts let Sync notice a pod that may have lost its policy
	// (it went unready, or a container restarted) and push again.
	Ready    bool
	Restarts int32
	Policy   policy.Policy
}

// PodState is what the pusher knows about one dispatcher pod.
type PodState struct {
	UID     types.UID
	Name    string
	Address string
	// AckedVersion is the policy version the pod last acknowledged.
	AckedVersion int64
	// Stats are the measured values of the pod's last Ack.
	Stats policy.Measured
	// Result of the last attempt ("" before the first one).
	Result PushResult
	// Err describes the last failed attempt; it wraps an ErrPush* sentinel.
	Err error
	// Failures counts consecutive failed attempts.
	Failures int
	// HeldVersion is the version a 409 (stale_version) said the pod holds.
	HeldVersion int64
	// HeldPool is the pool a 409 (pool_mismatch) said the pod holds: the
	// pod is selected by another ModelPool too.
	HeldPool string
	// Attempts counts push attempts to this pod.
	Attempts int
	// SchemaKnown is true once the pod answered a push; SchemaVersion is
	// then the policy schema revision its answer declared
	// (policy.SchemaHeader; 0 when absent), at which it is pushed from then
	// on.
	SchemaKnown   bool
	SchemaVersion int
	// Dropped are the fields in use that the policy at SchemaVersion
	// leaves out: the features the pod cannot enforce.
	Dropped []string
}

// PusherOptions configures a Pusher. Config.pusherOptions derives them
// from the controller's configuration; nothing here has a default.
type PusherOptions struct {
	// TokenFile holds the bearer token; it is followed through every push
	// (pushtoken.go), so a rotated mounted Secret takes effect. Empty, and
	// no Tokens, sends no token.
	TokenFile string
	// Tokens, when set, supplies the tokens instead of TokenFile.
	Tokens TokenSource
	// Timeout bounds one push attempt.
	Timeout time.Duration
	// BackoffBase and BackoffMax bound the retry delay after a failure,
	// which doubles per consecutive failure of a pod.
	BackoffBase, BackoffMax time.Duration
	// Workers bounds how many pushes run at once.
	Workers int
	// Clock drives the backoff timers.
	Clock clock.WithTicker
	// Transport overrides the HTTP transport (tests); nil is a direct
	// transport whose dial is bounded by Timeout.
	Transport http.RoundTripper
	// Notify, when set, is called after every attempt with the pod's pool,
	// so the pool is reconciled with the new state. It must not block for
	// long.
	Notify func(pool types.NamespacedName)
	// Log receives push outcomes; never a token or a Secret.
	Log logr.Logger
}

func (o PusherOptions) validate() error {
	switch {
	case o.Timeout <= 0:
		return fmt.Errorf("%w: push timeout %s must be positive", ErrInvalidOptions, o.Timeout)
	case o.BackoffBase <= 0 || o.BackoffMax < o.BackoffBase:
		return fmt.Errorf("%w: push backoff %s..%s must be positive, base <= max", ErrInvalidOptions, o.BackoffBase, o.BackoffMax)
	case o.Workers < 1:
		return fmt.Errorf("%w: push workers %d must be at least 1", ErrInvalidOptions, o.Workers)
	case o.Clock == nil:
		return fmt.Errorf("%w: the Pusher needs a clock", ErrInvalidOptions)
	}
	return nil
}

// directTransport reaches pod IPs, never through a proxy.
func directTransport(timeout time.Duration) *http.Transport {
	return &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 2,
		IdleConnTimeout:     90 * time.Second,
	}
}

// Pusher keeps every dispatcher pod supplied with its policy. A key (pool,
// pod) is queued on a rate-limited workqueue when the pod needs a push: its
// acknowledged version differs from its target's, a resync asks, or the pod
// may have lost its policy. Workers (a bounded number) push the newest
// target of a key; a key queued twice is pushed once, never by two workers
// at once, and a failed key comes back after its own exponential backoff.
// Pusher is a manager Runnable: workers run only between Start and the end
// of its context (so only on the leader).
type Pusher struct {
	opts    PusherOptions
	client  *http.Client
	limiter workqueue.TypedRateLimiter[pushKey]

	mu     sync.Mutex
	ctx    context.Context                               // nil until Start
	queue  workqueue.TypedRateLimitingInterface[pushKey] // nil until Start
	pods   map[pushKey]*podPush
	byPool map[types.NamespacedName]map[types.UID]bool

	// trace, when set (tests), hears what a worker did with a key.
	trace func(pushKey, pushEvent)
}

// pushKey names a queue item: one per pool and pod, so two pools that
// select the same pod (overlapping selectors) each push their own policy
// and see their own answers.
type pushKey struct {
	pool types.NamespacedName
	uid  types.UID
}

// podPush is one key's target and state, guarded by Pusher.mu.
type podPush struct {
	target Target
	state  PodState
	force  bool
	// failedVersion is the version of the last failed attempt: a newer one
	// is pushed at once, without waiting out the backoff.
	failedVersion int64
	retryAt       time.Time
	// queued is when the key was last queued for a push now (zero when it
	// is not): the push's log says how long it waited for a worker.
	queued time.Time
	// cancel ends the push in flight, when the pod stops being a target.
	cancel context.CancelFunc
	// inFlight is the target of the push in flight (valid while cancel is
	// set).
	inFlight Target
}

// pushingLocked says whether a push of t's policy to t's address is in
// flight: its answer serves a resync asked for meanwhile, which would
// otherwise push the same version again right after it.
func (pp *podPush) pushingLocked(t Target) bool {
	return pp.cancel != nil && pp.inFlight.Address == t.Address && pp.inFlight.Policy.Version == t.Policy.Version
}

// pushQueueName names the queue in controller-runtime's workqueue_*
// metrics (labels name and controller).
const pushQueueName = "push"

// NewPusher returns a Pusher; call Start (the manager does) to run it.
func NewPusher(opts PusherOptions) (*Pusher, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if opts.Transport == nil {
		opts.Transport = directTransport(opts.Timeout)
	}
	if opts.Notify == nil {
		opts.Notify = func(types.NamespacedName) {}
	}
	if opts.Tokens == nil {
		t, err := newPushTokens(opts.TokenFile, opts.Clock)
		if err != nil {
			return nil, err
		}
		opts.Tokens = t
	}
	return &Pusher{
		opts: opts,
		// The per-attempt timeout comes from the request context.
		client:  &http.Client{Transport: opts.Transport, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		limiter: workqueue.NewTypedItemExponentialFailureRateLimiter[pushKey](opts.BackoffBase, opts.BackoffMax),
		pods:    map[pushKey]*podPush{},
		byPool:  map[types.NamespacedName]map[types.UID]bool{},
	}, nil
}

// Start runs the workers until ctx ends, then waits for them. The queue's
// metrics go to controller-runtime's registry, whose provider client-go's
// workqueue uses for every named queue.
func (p *Pusher) Start(ctx context.Context) error {
	q := workqueue.NewTypedRateLimitingQueueWithConfig(p.limiter, workqueue.TypedRateLimitingQueueConfig[pushKey]{
		Name: pushQueueName, Clock: p.opts.Clock,
	})
	p.mu.Lock()
	p.ctx, p.queue = ctx, q
	for k, pp := range p.pods {
		p.enqueueLocked(k, pp)
	}
	p.mu.Unlock()
	var wg sync.WaitGroup
	for range p.opts.Workers {
		wg.Go(func() {
			for p.processNext(ctx, q) {
			}
		})
	}
	<-ctx.Done()
	q.ShutDown()
	wg.Wait()
	return nil
}

// Sync makes targets the pool's complete set of dispatcher pods. New pods
// are queued, pods no longer listed are dropped (a push in flight to one is
// cancelled, and it is never pushed to again), and every listed pod is
// queued when its acknowledged version differs. resync pushes to every pod
// even when it is up to date, except one whose push of the same version
// is in flight: that push's answer is the resync's. A pod backing off
// after a failure of the same version waits out its backoff.
func (p *Pusher) Sync(pool types.NamespacedName, targets []Target, resync bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	keep := map[types.UID]bool{}
	for _, t := range targets {
		keep[t.UID] = true
		k := pushKey{pool, t.UID}
		pp, ok := p.pods[k]
		if !ok {
			pp = &podPush{target: t, state: PodState{UID: t.UID, Name: t.Name, Address: t.Address}}
			p.pods[k] = pp
		} else {
			prev := pp.target
			// A pod that went unready or restarted a container may have lost
			// its policy although it acknowledged it.
			if (prev.Ready && !t.Ready) || t.Restarts != prev.Restarts || t.Address != prev.Address {
				pp.force = true
			}
			pp.target = t
			pp.state.Name, pp.state.Address = t.Name, t.Address
		}
		if resync && !pp.pushingLocked(t) {
			pp.force = true
		}
		p.enqueueLocked(k, pp)
	}
	for uid := range p.byPool[pool] {
		if !keep[uid] {
			p.dropLocked(pushKey{pool, uid})
		}
	}
	p.byPool[pool] = keep
}

// Forget stops pushing to every pod of the pool.
func (p *Pusher) Forget(pool types.NamespacedName) { p.Sync(pool, nil, false) }

// States returns the state of the pool's current pods, by pod name.
func (p *Pusher) States(pool types.NamespacedName) []PodState {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]PodState, 0, len(p.byPool[pool]))
	for uid := range p.byPool[pool] {
		out = append(out, p.pods[pushKey{pool, uid}].state)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Name < out[b].Name })
	return out
}

// enqueueLocked queues the key when its pod needs a push now; one backing
// off is already queued for the end of its backoff.
func (p *Pusher) enqueueLocked(k pushKey, pp *podPush) {
	if p.queue == nil {
		return // Start queues it
	}
	if need, wait := p.planLocked(pp); need && wait <= 0 {
		if pp.queued.IsZero() {
			pp.queued = p.opts.Clock.Now()
		}
		p.queue.Add(k)
	}
}

func (p *Pusher) dropLocked(k pushKey) {
	pp, ok := p.pods[k]
	if !ok {
		return
	}
	if pp.cancel != nil {
		pp.cancel()
	}
	delete(p.pods, k)
	if p.queue != nil {
		p.queue.Forget(k) // the limiter forgets its failures
	}
}

// planLocked says whether the pod needs a push and how long its backoff
// still lasts.
func (p *Pusher) planLocked(pp *podPush) (need bool, wait time.Duration) {
	need = pp.force || pp.state.AckedVersion != pp.target.Policy.Version
	if need && pp.state.Failures > 0 && pp.failedVersion == pp.target.Policy.Version {
		wait = pp.retryAt.Sub(p.opts.Clock.Now())
	}
	return need, wait
}
