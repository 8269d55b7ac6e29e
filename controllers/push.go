package controllers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
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
}

// PusherOptions configures a Pusher. Zero values take the defaults.
type PusherOptions struct {
	// TokenFile holds the bearer token; it is followed through every push
	// (pushtoken.go), so a rotated mounted Secret takes effect. Empty, and
	// no Tokens, sends no token.
	TokenFile string
	// Tokens, when set, supplies the tokens instead of TokenFile.
	Tokens TokenSource
	// Timeout bounds one push attempt (default 5s).
	Timeout time.Duration
	// BackoffBase and BackoffMax bound the retry delay after a failure,
	// which doubles per consecutive failure (defaults 250ms and 5s: a
	// dispatcher that starts late must not wait long for its policy).
	BackoffBase, BackoffMax time.Duration
	// Clock drives the backoff timers (default the real clock).
	Clock clock.WithTicker
	// Transport overrides the HTTP transport (tests).
	Transport http.RoundTripper
	// Notify is called after every attempt with the pod's pool, so the pool
	// is reconciled with the new state. It must not block for long.
	Notify func(pool types.NamespacedName)
	// Log receives push outcomes; never a token or a Secret.
	Log logr.Logger
}

func (o *PusherOptions) defaults() {
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Second
	}
	if o.BackoffBase == 0 {
		o.BackoffBase = 250 * time.Millisecond
	}
	if o.BackoffMax == 0 {
		o.BackoffMax = 5 * time.Second
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Transport == nil {
		o.Transport = &http.Transport{
			// Pod IPs are never reached through a proxy.
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: o.Timeout, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 2,
			IdleConnTimeout:     90 * time.Second,
		}
	}
	if o.Notify == nil {
		o.Notify = func(types.NamespacedName) {}
	}
}

func (o *PusherOptions) validate() error {
	if o.Timeout < 0 || o.BackoffBase < 0 || o.BackoffMax < o.BackoffBase {
		return fmt.Errorf("push options: timeout %s, backoff %s..%s: durations must be positive and base <= max", o.Timeout, o.BackoffBase, o.BackoffMax)
	}
	return nil
}

// Pusher keeps every dispatcher pod supplied with its policy. Each pod has
// one sender goroutine per pool while it is that pool's target (a pod two
// pools select has two, and holds one pool's policy); the goroutine pushes when the
// pod's acknowledged version differs from its target's, or when a resync
// asks, and backs off after failures. Pusher is a manager Runnable: senders
// run only between Start and the end of its context (so only on the leader).
type Pusher struct {
	opts   PusherOptions
	client *http.Client

	mu      sync.Mutex
	ctx     context.Context // nil until Start
	wg      sync.WaitGroup
	senders map[senderKey]*sender
	byPool  map[types.NamespacedName]map[types.UID]bool

	// trace, when set (tests), hears each sender park and stop.
	trace func(types.UID, senderEvent)
}

// senderKey names a sender: one per pool and pod, so two pools that
// select the same pod (overlapping selectors) each push their own policy
// and see their own answers.
type senderKey struct {
	pool types.NamespacedName
	uid  types.UID
}

type sender struct {
	uid    types.UID // never changes, so it is read without the lock
	pool   types.NamespacedName
	target Target
	state  PodState
	force  bool
	// failedVersion is the version of the last failed attempt: a newer one
	// is tried at once, without waiting out the backoff.
	failedVersion int64
	retryAt       time.Time
	kick          chan struct{}
	cancel        context.CancelFunc
}

// NewPusher returns a Pusher; call Start (the manager does) to run it.
func NewPusher(opts PusherOptions) (*Pusher, error) {
	opts.defaults()
	if err := opts.validate(); err != nil {
		return nil, err
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
		senders: map[senderKey]*sender{},
		byPool:  map[types.NamespacedName]map[types.UID]bool{},
	}, nil
}

// Start runs the senders until ctx ends, then waits for them.
func (p *Pusher) Start(ctx context.Context) error {
	p.mu.Lock()
	p.ctx = ctx
	for _, s := range p.senders {
		p.startLocked(s)
	}
	p.mu.Unlock()
	<-ctx.Done()
	p.wg.Wait()
	return nil
}

// Sync makes targets the pool's complete set of dispatcher pods. New pods
// get a sender, pods no longer listed lose theirs (and are never pushed to
// again), and every listed pod is pushed when its acknowledged version
// differs. resync pushes to every pod even when it is up to date.
func (p *Pusher) Sync(pool types.NamespacedName, targets []Target, resync bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	keep := map[types.UID]bool{}
	for _, t := range targets {
		keep[t.UID] = true
		s, ok := p.senders[senderKey{pool, t.UID}]
		if !ok {
			s = &sender{uid: t.UID, pool: pool, target: t, kick: make(chan struct{}, 1),
				state: PodState{UID: t.UID, Name: t.Name, Address: t.Address}}
			p.senders[senderKey{pool, t.UID}] = s
			if p.ctx != nil {
				p.startLocked(s)
			}
		} else {
			prev := s.target
			// A pod that went unready or restarted a container may have lost
			// its policy although it acknowledged it.
			if (prev.Ready && !t.Ready) || t.Restarts != prev.Restarts || t.Address != prev.Address {
				s.force = true
			}
			s.target = t
			s.state.Name, s.state.Address = t.Name, t.Address
		}
		if resync {
			s.force = true
		}
		if ok {
			// A new sender plans when it starts; an existing one is woken.
			select {
			case s.kick <- struct{}{}:
			default:
			}
		}
	}
	for uid := range p.byPool[pool] {
		if !keep[uid] {
			p.stopLocked(senderKey{pool, uid})
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
		out = append(out, p.senders[senderKey{pool, uid}].state)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Name < out[b].Name })
	return out
}

func (p *Pusher) startLocked(s *sender) {
	ctx, cancel := context.WithCancel(p.ctx)
	s.cancel = cancel
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.run(ctx, s)
	}()
}

func (p *Pusher) stopLocked(k senderKey) {
	if s, ok := p.senders[k]; ok {
		if s.cancel != nil {
			s.cancel()
		}
		delete(p.senders, k)
	}
}

// senderEvent is what a sender reports to Pusher.trace.
type senderEvent int

const (
	senderIdle    senderEvent = iota // up to date: waiting for a kick
	senderBackoff                    // a backoff timer is armed: waiting for it or a kick
	senderStopped                    // the pod is no longer a target
)

func (p *Pusher) note(s *sender, ev senderEvent) {
	if p.trace != nil {
		p.trace(s.uid, ev)
	}
}

// run is one pod's sender loop.
func (p *Pusher) run(ctx context.Context, s *sender) {
	defer p.note(s, senderStopped)
	for {
		need, wait := p.plan(s)
		if !need || wait > 0 {
			if !p.park(ctx, s, need, wait) {
				return
			}
			continue
		}
		tgt := p.take(s)
		a := p.push(ctx, tgt)
		if ctx.Err() != nil {
			return // stopped while pushing: the pod is no longer a target
		}
		p.record(s, tgt, a)
		log := p.opts.Log.WithValues("pool", s.pool.String(), "pod", tgt.Name, "address", tgt.Address, "version", tgt.Policy.Version)
		if a.err != nil {
			log.Info("push failed", "result", string(a.result), "error", a.err.Error())
		} else {
			log.V(1).Info("pushed", "acked", a.ack.Version)
		}
		p.opts.Notify(s.pool)
	}
}

// plan says whether the pod needs a push and how long its backoff still
// lasts.
func (p *Pusher) plan(s *sender) (need bool, wait time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	need = s.force || s.state.AckedVersion != s.target.Policy.Version
	if need && s.state.Failures > 0 && s.failedVersion == s.target.Policy.Version {
		wait = s.retryAt.Sub(p.opts.Clock.Now())
	}
	return need, wait
}

// park waits for a kick, or for the backoff when the pod needs a push;
// false when ctx ended.
func (p *Pusher) park(ctx context.Context, s *sender, backoff bool, wait time.Duration) bool {
	var fire <-chan time.Time
	if backoff {
		t := p.opts.Clock.NewTimer(wait)
		defer t.Stop()
		fire = t.C()
		p.note(s, senderBackoff)
	} else {
		p.note(s, senderIdle)
	}
	select {
	case <-s.kick:
	case <-fire:
	case <-ctx.Done():
		return false
	}
	return true
}

// take is the target to push now; it clears a forced push.
func (p *Pusher) take(s *sender) Target {
	p.mu.Lock()
	defer p.mu.Unlock()
	s.force = false
	return s.target
}

// record folds an attempt into the pod's state.
func (p *Pusher) record(s *sender, tgt Target, a attempt) {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := &s.state
	st.Attempts++
	st.Result = a.result
	st.Err = a.err
	if a.result == PushOK {
		st.AckedVersion = a.ack.Version
		st.Stats = a.ack.Stats
		st.Failures = 0
		st.HeldVersion = 0
		st.HeldPool = ""
		return
	}
	st.Failures++
	if a.result == PushConflict {
		st.HeldVersion = a.held
	}
	st.HeldPool = a.heldPool
	s.failedVersion = tgt.Policy.Version
	s.retryAt = p.opts.Clock.Now().Add(p.backoff(st.Failures))
}

func (p *Pusher) backoff(failures int) time.Duration {
	d := p.opts.BackoffBase
	for i := 1; i < failures && d < p.opts.BackoffMax; i++ {
		d *= 2
	}
	return min(d, p.opts.BackoffMax)
}

type attempt struct {
	result   PushResult
	err      error
	ack      policy.Ack
	held     int64
	heldPool string
}

// maxAnswer bounds how much of a dispatcher's answer is read.
const maxAnswer = 64 << 10

// push sends one PUT /v1/policy and classifies the answer.
func (p *Pusher) push(ctx context.Context, t Target) attempt {
	start := time.Now()
	a := p.pushOnce(ctx, t)
	pushTotal.WithLabelValues(string(a.result)).Inc()
	pushLatency.Observe(time.Since(start).Seconds())
	return a
}

func (p *Pusher) pushOnce(ctx context.Context, t Target) attempt {
	tokens, err := p.opts.Tokens.PushTokens()
	if err != nil {
		return attempt{result: PushFailed, err: fmt.Errorf("%w: %v", ErrPushFailed, err)}
	}
	body, err := json.Marshal(t.Policy)
	if err != nil {
		return attempt{result: PushFailed, err: fmt.Errorf("%w: encoding policy: %v", ErrPushFailed, err)}
	}
	ctx, cancel := context.WithTimeout(ctx, p.opts.Timeout)
	defer cancel()
	code, answer, err := p.putWithTokens(ctx, t.Address, tokens, body)
	if err != nil {
		return attempt{result: PushUnreachable, err: fmt.Errorf("%w: %s: %v", ErrPushUnreachable, t.Address, err)}
	}
	if code == http.StatusOK {
		var ack policy.Ack
		if err := json.Unmarshal(answer, &ack); err != nil {
			return attempt{result: PushFailed, err: fmt.Errorf("%w: %s answered 200 with an unreadable ack: %v", ErrPushFailed, t.Address, err)}
		}
		if ack.Version != t.Policy.Version {
			return attempt{result: PushFailed, err: fmt.Errorf("%w: %s acknowledged version %d, sent %d", ErrPushFailed, t.Address, ack.Version, t.Policy.Version)}
		}
		return attempt{result: PushOK, ack: ack}
	}
	return refused(t, code, answer)
}

// refused classifies an error answer, which the admin API sends as a
// policy.AdminErrorBody.
func refused(t Target, code int, answer []byte) attempt {
	var body policy.AdminErrorBody
	detail := summarize(answer)
	if json.Unmarshal(answer, &body) == nil && body.Error.Type != "" {
		detail = describe(body.Error)
	}
	what := fmt.Sprintf("%s answered %d", t.Address, code)
	if detail != "" {
		what += ": " + detail
	}
	e := body.Error
	switch {
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		return attempt{result: PushUnauthorized, err: fmt.Errorf("%w: %s", ErrPushUnauthorized, what)}
	case code == http.StatusBadRequest:
		return attempt{result: PushRejected, err: fmt.Errorf("%w: %s", ErrPushRejected, what)}
	case code == http.StatusConflict && e.Type == policy.AdminPoolMismatch && e.CurrentPool != "":
		return attempt{result: PushPoolMismatch, heldPool: e.CurrentPool,
			err: fmt.Errorf("%w: %s holds the policy of pool %s, sent pool %s", ErrPushPoolMismatch, t.Address, e.CurrentPool, t.Policy.Pool)}
	case code == http.StatusConflict && e.Type == policy.AdminStaleVersion && e.CurrentVersion != nil:
		held := *e.CurrentVersion
		return attempt{result: PushConflict, held: held, err: fmt.Errorf("%w: %s holds version %d, sent %d", ErrPushConflict, t.Address, held, t.Policy.Version)}
	default:
		return attempt{result: PushFailed, err: fmt.Errorf("%w: %s", ErrPushFailed, what)}
	}
}

// describe is an admin error for a condition message: its type, message
// and every field error.
func describe(e policy.AdminErrorDetail) string {
	var b strings.Builder
	b.WriteString(string(e.Type))
	if e.Message != "" {
		b.WriteString(": " + e.Message)
	}
	for i, fe := range e.Errors {
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString("; ")
		}
		b.WriteString(fe.Error())
	}
	return b.String()
}

// put sends one PUT /v1/policy and returns the status code and up to
// maxAnswer bytes of the answer; the body is closed.
func (p *Pusher) put(ctx context.Context, address, token string, body []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, "http://"+address+"/v1/policy", bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return 0, nil, err
	}
	return resp.StatusCode, answer, nil
}

// summarize shortens a dispatcher's answer for a condition message.
func summarize(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 512 {
		s = s[:512] + "…"
	}
	return s
}
