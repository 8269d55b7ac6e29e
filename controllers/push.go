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
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/tiergate/tiergate/dispatcher/policy"
)

// PushResult classifies one push attempt. Its values are the result label
// of tiergate_push_total.
type PushResult string

// Push results.
const (
	PushOK           PushResult = "success"
	PushUnauthorized PushResult = "unauthorized" // 401 or 403: wrong or missing token
	PushRejected     PushResult = "rejected"     // 400: the dispatcher found the policy invalid
	PushConflict     PushResult = "conflict"     // 409: the dispatcher holds a newer version
	PushUnreachable  PushResult = "unreachable"  // no HTTP answer within the timeout
	PushFailed       PushResult = "error"        // any other answer, or no token to send
)

// Sentinel errors of a push attempt; PodState.Err wraps one of them.
var (
	ErrPushUnauthorized = errors.New("dispatcher refused the push token")
	ErrPushRejected     = errors.New("dispatcher rejected the policy")
	ErrPushConflict     = errors.New("dispatcher holds a newer policy version")
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
	// HeldVersion is the version a 409 reported the pod holds.
	HeldVersion int64
	// Attempts counts push attempts to this pod.
	Attempts int
}

// PusherOptions configures a Pusher. Zero values take the defaults.
type PusherOptions struct {
	// TokenFile holds the bearer token; it is read before every push so a
	// rotated mounted Secret takes effect. Empty sends no token.
	TokenFile string
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
// one sender goroutine while it is a target; the goroutine pushes when the
// pod's acknowledged version differs from its target's, or when a resync
// asks, and backs off after failures. Pusher is a manager Runnable: senders
// run only between Start and the end of its context (so only on the leader).
type Pusher struct {
	opts   PusherOptions
	client *http.Client

	mu      sync.Mutex
	ctx     context.Context // nil until Start
	wg      sync.WaitGroup
	senders map[types.UID]*sender
	byPool  map[types.NamespacedName]map[types.UID]bool
}

type sender struct {
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
	return &Pusher{
		opts: opts,
		// The per-attempt timeout comes from the request context.
		client:  &http.Client{Transport: opts.Transport, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		senders: map[types.UID]*sender{},
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
		s, ok := p.senders[t.UID]
		if !ok {
			s = &sender{pool: pool, target: t, kick: make(chan struct{}, 1),
				state: PodState{UID: t.UID, Name: t.Name, Address: t.Address}}
			p.senders[t.UID] = s
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
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
	for uid := range p.byPool[pool] {
		if !keep[uid] {
			p.stopLocked(uid)
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
		out = append(out, p.senders[uid].state)
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

func (p *Pusher) stopLocked(uid types.UID) {
	if s, ok := p.senders[uid]; ok {
		if s.cancel != nil {
			s.cancel()
		}
		delete(p.senders, uid)
	}
}

// run is one pod's sender loop.
func (p *Pusher) run(ctx context.Context, s *sender) {
	for {
		p.mu.Lock()
		need := s.force || s.state.AckedVersion != s.target.Policy.Version
		var wait time.Duration
		if need && s.state.Failures > 0 && s.failedVersion == s.target.Policy.Version {
			wait = s.retryAt.Sub(p.opts.Clock.Now())
		}
		p.mu.Unlock()

		if !need {
			select {
			case <-s.kick:
				continue
			case <-ctx.Done():
				return
			}
		}
		if wait > 0 {
			t := p.opts.Clock.NewTimer(wait)
			select {
			case <-t.C():
			case <-s.kick:
				t.Stop()
				continue
			case <-ctx.Done():
				t.Stop()
				return
			}
		}

		p.mu.Lock()
		tgt := s.target
		s.force = false
		p.mu.Unlock()

		a := p.push(ctx, tgt)
		if ctx.Err() != nil {
			return // stopped while pushing: the pod is no longer a target
		}

		p.mu.Lock()
		st := &s.state
		st.Attempts++
		st.Result = a.result
		st.Err = a.err
		if a.result == PushOK {
			st.AckedVersion = a.ack.Version
			st.Stats = a.ack.Stats
			st.Failures = 0
			st.HeldVersion = 0
		} else {
			st.Failures++
			if a.result == PushConflict {
				st.HeldVersion = a.held
			}
			s.failedVersion = tgt.Policy.Version
			s.retryAt = p.opts.Clock.Now().Add(p.backoff(st.Failures))
		}
		p.mu.Unlock()

		log := p.opts.Log.WithValues("pool", s.pool.String(), "pod", tgt.Name, "address", tgt.Address, "version", tgt.Policy.Version)
		if a.err != nil {
			log.Info("push failed", "result", string(a.result), "error", a.err.Error())
		} else {
			log.V(1).Info("pushed", "acked", a.ack.Version)
		}
		p.opts.Notify(s.pool)
	}
}

func (p *Pusher) backoff(failures int) time.Duration {
	d := p.opts.BackoffBase
	for i := 1; i < failures && d < p.opts.BackoffMax; i++ {
		d *= 2
	}
	return min(d, p.opts.BackoffMax)
}

type attempt struct {
	result PushResult
	err    error
	ack    policy.Ack
	held   int64
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
	token, err := p.token()
	if err != nil {
		return attempt{result: PushFailed, err: fmt.Errorf("%w: %v", ErrPushFailed, err)}
	}
	body, err := json.Marshal(t.Policy)
	if err != nil {
		return attempt{result: PushFailed, err: fmt.Errorf("%w: encoding policy: %v", ErrPushFailed, err)}
	}
	ctx, cancel := context.WithTimeout(ctx, p.opts.Timeout)
	defer cancel()
	code, answer, err := p.do(ctx, http.MethodPut, t.Address, token, body)
	if err != nil {
		return attempt{result: PushUnreachable, err: fmt.Errorf("%w: %s: %v", ErrPushUnreachable, t.Address, err)}
	}
	switch code {
	case http.StatusOK:
		var ack policy.Ack
		if err := json.Unmarshal(answer, &ack); err != nil {
			return attempt{result: PushFailed, err: fmt.Errorf("%w: %s answered 200 with an unreadable ack: %v", ErrPushFailed, t.Address, err)}
		}
		if ack.Version != t.Policy.Version {
			return attempt{result: PushFailed, err: fmt.Errorf("%w: %s acknowledged version %d, sent %d", ErrPushFailed, t.Address, ack.Version, t.Policy.Version)}
		}
		return attempt{result: PushOK, ack: ack}
	case http.StatusUnauthorized, http.StatusForbidden:
		return attempt{result: PushUnauthorized, err: fmt.Errorf("%w: %s answered %d", ErrPushUnauthorized, t.Address, code)}
	case http.StatusBadRequest:
		return attempt{result: PushRejected, err: fmt.Errorf("%w: %s answered 400: %s", ErrPushRejected, t.Address, summarize(answer))}
	case http.StatusConflict:
		held := heldVersion(answer)
		if held == 0 {
			held = p.fetchVersion(ctx, t.Address, token)
		}
		return attempt{result: PushConflict, held: held, err: fmt.Errorf("%w: %s holds version %d, sent %d", ErrPushConflict, t.Address, held, t.Policy.Version)}
	default:
		return attempt{result: PushFailed, err: fmt.Errorf("%w: %s answered %d: %s", ErrPushFailed, t.Address, code, summarize(answer))}
	}
}

// do sends one request and returns the status code and up to maxAnswer
// bytes of the answer; the body is closed.
func (p *Pusher) do(ctx context.Context, method, address, token string, body []byte) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+address+"/v1/policy", rd)
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
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

// fetchVersion asks a dispatcher which version it holds (after a 409 whose
// body did not say). 0 when it cannot tell.
func (p *Pusher) fetchVersion(ctx context.Context, address, token string) int64 {
	code, answer, err := p.do(ctx, http.MethodGet, address, token, nil)
	if err != nil || code != http.StatusOK {
		return 0
	}
	return heldVersion(answer)
}

// heldVersion reads a version from a JSON answer: a Policy or an Ack
// ({"version": N}), or an error body naming it ({"error": {..., "version": N}}
// or "currentVersion").
func heldVersion(answer []byte) int64 {
	var doc struct {
		Version        int64 `json:"version"`
		CurrentVersion int64 `json:"currentVersion"`
		Error          struct {
			Version        int64 `json:"version"`
			CurrentVersion int64 `json:"currentVersion"`
		} `json:"error"`
	}
	if json.Unmarshal(answer, &doc) != nil {
		return 0
	}
	return max(doc.Version, doc.CurrentVersion, doc.Error.Version, doc.Error.CurrentVersion)
}

func (p *Pusher) token() (string, error) {
	if p.opts.TokenFile == "" {
		return "", nil
	}
	b, err := os.ReadFile(p.opts.TokenFile)
	if err != nil {
		return "", fmt.Errorf("reading the push token: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// summarize shortens a dispatcher's answer for a condition message.
func summarize(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 512 {
		s = s[:512] + "…"
	}
	return s
}
