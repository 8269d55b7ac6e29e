package controllers

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// pusherHarness runs a Pusher with a fake clock and hears every attempt
// (Notify) and what the workers did with each key (trace).
type pusherHarness struct {
	p      *Pusher
	clk    *clocktesting.FakeClock
	notify chan types.NamespacedName
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	events map[types.UID]chan pushEvent
}

func startPusher(t *testing.T, tokenFile string) *pusherHarness {
	t.Helper()
	return startPusherWith(t, testPusherOptions(tokenFile, 5*time.Second))
}

// startPusherWith starts a Pusher of opts with the harness's clock and
// notify.
func startPusherWith(t *testing.T, opts PusherOptions) *pusherHarness {
	t.Helper()
	h := &pusherHarness{clk: clocktesting.NewFakeClock(time.Unix(1000, 0)), notify: make(chan types.NamespacedName, 100),
		done: make(chan struct{}), events: map[types.UID]chan pushEvent{}}
	opts.Clock = h.clk
	opts.Notify = func(n types.NamespacedName) { h.notify <- n }
	p, err := NewPusher(opts)
	if err != nil {
		t.Fatal(err)
	}
	p.trace = func(k pushKey, ev pushEvent) { h.eventsOf(k.uid) <- ev }
	h.p = p
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { _ = p.Start(ctx); close(h.done) }()
	t.Cleanup(h.stop)
	return h
}

func (h *pusherHarness) stop() {
	h.cancel()
	<-h.done
}

func (h *pusherHarness) eventsOf(uid types.UID) chan pushEvent {
	h.mu.Lock()
	defer h.mu.Unlock()
	ch, ok := h.events[uid]
	if !ok {
		ch = make(chan pushEvent, 1000)
		h.events[uid] = ch
	}
	return ch
}

// queued is the number of keys ready in the queue, -1 before Start made it.
func (h *pusherHarness) queued() int {
	h.p.mu.Lock()
	defer h.p.mu.Unlock()
	if h.p.queue == nil {
		return -1
	}
	return h.p.queue.Len()
}

// retryIn is how long the key's backoff still lasts on the fake clock.
func (h *pusherHarness) retryIn(pool types.NamespacedName, uid types.UID) time.Duration {
	h.p.mu.Lock()
	defer h.p.mu.Unlock()
	return h.p.pods[pushKey{pool, uid}].retryAt.Sub(h.clk.Now())
}

// next waits for one attempt to finish.
func (h *pusherHarness) next(t *testing.T) {
	t.Helper()
	select {
	case <-h.notify:
	case <-time.After(10 * time.Second):
		t.Fatal("no push attempt finished within 10s")
	}
}

// expect waits for what a worker did with uid's key; it must be the next
// event of that key.
func (h *pusherHarness) expect(t *testing.T, uid types.UID, want pushEvent) {
	t.Helper()
	select {
	case got := <-h.eventsOf(uid):
		if got != want {
			t.Fatalf("%s: push event %d, want %d", uid, got, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no push event %d within 10s", uid, want)
	}
}

// stepUntilAttempt steps the fake clock by d until an attempt finishes, at
// most steps times. client-go's delaying queue reads the clock on its own
// goroutine when it takes a deferred key, so a single step can land before
// the key is waiting and miss it.
func (h *pusherHarness) stepUntilAttempt(t *testing.T, d time.Duration, steps int) {
	t.Helper()
	for range steps {
		h.clk.Step(d)
		select {
		case <-h.notify:
			return
		case <-time.After(time.Second):
		}
	}
	t.Fatalf("no push attempt finished within %d steps of %s", steps, d)
}

// noAttempt asserts that no attempt has finished that next did not take.
func (h *pusherHarness) noAttempt(t *testing.T) {
	t.Helper()
	select {
	case n := <-h.notify:
		t.Fatalf("unexpected push attempt for %s", n)
	default:
	}
}

// idle asserts that Sync queued nothing: the pods are current.
func (h *pusherHarness) idle(t *testing.T) {
	t.Helper()
	if n := h.queued(); n != 0 {
		t.Fatalf("%d keys queued, want none", n)
	}
	h.noAttempt(t)
}

var testPool = types.NamespacedName{Namespace: "ns", Name: "p"}

func target(uid types.UID, d *dispatcherServer, version int64) Target {
	return Target{UID: uid, Name: "d-" + string(uid), Address: d.addr(), Policy: pushPolicy(version)}
}

func TestPusherAcksAndStopsWhenCurrent(t *testing.T) {
	d := newDispatcherServer(t, serverOptions{token: "tok"})
	h := startPusher(t, writeToken(t, "tok"))
	h.p.Sync(testPool, []Target{target("u1", d, 1)}, false)
	h.next(t)
	h.expect(t, "u1", pushDone)
	states := h.p.States(testPool)
	if len(states) != 1 || states[0].AckedVersion != 1 || states[0].Result != PushOK || !cmp.Equal(states[0].Stats, testMeasured) {
		t.Fatalf("states = %+v, want d-u1 acked at 1 with its stats", states)
	}
	// Same version again: nothing is queued.
	h.p.Sync(testPool, []Target{target("u1", d, 1)}, false)
	h.idle(t)
	// A resync pushes although the pod is current.
	h.p.Sync(testPool, []Target{target("u1", d, 1)}, true)
	h.next(t)
	if got := d.putCount(); got != 2 {
		t.Errorf("PUTs = %d, want 2 (first push and resync)", got)
	}
}

func TestPusherRepushesAPodThatLostReadinessOrRestarted(t *testing.T) {
	d := newDispatcherServer(t, serverOptions{token: "tok"})
	h := startPusher(t, writeToken(t, "tok"))
	tgt := target("u1", d, 1)
	tgt.Ready = true
	h.p.Sync(testPool, []Target{tgt}, false)
	h.next(t)
	h.expect(t, "u1", pushDone)
	tgt.Ready = false
	h.p.Sync(testPool, []Target{tgt}, false)
	h.next(t)
	h.expect(t, "u1", pushDone)
	// Still unready, nothing new: no push.
	h.p.Sync(testPool, []Target{tgt}, false)
	h.idle(t)
	tgt.Restarts = 1
	h.p.Sync(testPool, []Target{tgt}, false)
	h.next(t)
	if got := d.putCount(); got != 3 {
		t.Errorf("PUTs = %d, want 3", got)
	}
}

// pushQueueMetric is the value of one of controller-runtime's workqueue_*
// series of the push queue, and whether the series exists.
func pushQueueMetric(t *testing.T, name string) (float64, bool) {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if l := labelsOf(m); l["name"] == pushQueueName && l["controller"] == pushQueueName {
				return m.GetCounter().GetValue() + m.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}

func labelsOf(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

func TestPusherBacksOffAndRetries(t *testing.T) {
	d := newDispatcherServer(t, serverOptions{token: "tok"})
	var mu sync.Mutex
	fails := 2
	d.intercept = func(w http.ResponseWriter, _ *http.Request) bool {
		mu.Lock()
		defer mu.Unlock()
		if fails == 0 {
			return false
		}
		fails--
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, "warming up")
		return true
	}
	adds, _ := pushQueueMetric(t, "workqueue_adds_total")
	retries, _ := pushQueueMetric(t, "workqueue_retries_total")
	h := startPusher(t, writeToken(t, "tok"))
	h.p.Sync(testPool, []Target{target("u1", d, 4)}, false)
	h.next(t)
	if s := h.p.States(testPool)[0]; s.Failures != 1 || s.Result != PushFailed {
		t.Fatalf("after the first attempt: %+v, want 1 failure", s)
	}
	for i, backoff := range []time.Duration{250 * time.Millisecond, 500 * time.Millisecond} {
		h.expect(t, "u1", pushBackoff)
		if got := h.retryIn(testPool, "u1"); got != backoff {
			t.Fatalf("retry %d: backoff %s, want %s", i+1, got, backoff)
		}
		// A resync while backing off waits for the backoff too.
		h.p.Sync(testPool, []Target{target("u1", d, 4)}, true)
		h.idle(t)
		h.clk.Step(backoff)
		h.next(t)
	}
	h.expect(t, "u1", pushDone)
	s := h.p.States(testPool)[0]
	if s.AckedVersion != 4 || s.Failures != 0 || s.Attempts != 3 || s.Err != nil {
		t.Errorf("final state %+v, want acked 4 after 3 attempts", s)
	}
	if got := d.putCount(); got != 3 {
		t.Errorf("PUTs = %d, want 3", got)
	}
	addsNow, _ := pushQueueMetric(t, "workqueue_adds_total")
	retriesNow, _ := pushQueueMetric(t, "workqueue_retries_total")
	got := map[string]float64{"adds": addsNow - adds, "retries": retriesNow - retries}
	if diff := cmp.Diff(map[string]float64{"adds": 3, "retries": 2}, got); diff != "" {
		t.Errorf("workqueue metrics of the push queue (-want +got):\n%s", diff)
	}
	for _, name := range []string{"workqueue_depth", "workqueue_queue_duration_seconds", "workqueue_work_duration_seconds"} {
		if _, ok := pushQueueMetric(t, name); !ok {
			t.Errorf("no %s series of the push queue", name)
		}
	}
}

func TestPusherNewVersionSkipsTheBackoff(t *testing.T) {
	d := newDispatcherServer(t, serverOptions{token: "tok"})
	h := startPusher(t, writeToken(t, "tok"))
	bad := target("u1", d, 1)
	bad.Policy.Slots = -1
	h.p.Sync(testPool, []Target{bad}, false)
	h.next(t)
	if s := h.p.States(testPool)[0]; s.Result != PushRejected || !errors.Is(s.Err, ErrPushRejected) {
		t.Fatalf("state %+v, want rejected", s)
	}
	h.expect(t, "u1", pushBackoff)
	h.p.Sync(testPool, []Target{target("u1", d, 2)}, false)
	h.next(t) // no clock step needed
	if s := h.p.States(testPool)[0]; s.AckedVersion != 2 || d.backend.version() != 2 {
		t.Errorf("state %+v, dispatcher at %d; want both at 2", s, d.backend.version())
	}
	// The first failure's retry comes due: the pod is current, nothing is
	// pushed.
	h.expect(t, "u1", pushDone)
	h.clk.Step(250 * time.Millisecond)
	h.expect(t, "u1", pushSkipped)
	h.noAttempt(t)
}

// A new version that fails too backs off for the doubled delay, although
// the first failure's retry comes due earlier.
func TestPusherAFailedNewVersionBacksOffForTheDoubledDelay(t *testing.T) {
	d := newDispatcherServer(t, serverOptions{token: "tok"})
	h := startPusher(t, writeToken(t, "tok"))
	bad := func(v int64) Target { b := target("u1", d, v); b.Policy.Slots = -1; return b }
	h.p.Sync(testPool, []Target{bad(1)}, false)
	h.next(t)
	h.expect(t, "u1", pushBackoff)
	h.p.Sync(testPool, []Target{bad(2)}, false)
	h.next(t)
	h.expect(t, "u1", pushBackoff)
	if got := h.retryIn(testPool, "u1"); got != 500*time.Millisecond {
		t.Fatalf("backoff %s, want 500ms", got)
	}
	h.clk.Step(250 * time.Millisecond)
	h.expect(t, "u1", pushDeferred)
	h.noAttempt(t)
	h.stepUntilAttempt(t, 250*time.Millisecond, 8)
	if got := d.putCount(); got != 3 {
		t.Errorf("PUTs = %d, want 3", got)
	}
}

// A 409 records the version the dispatcher holds, read from its answer.
func TestPusherRecordsTheHeldVersion(t *testing.T) {
	d := newDispatcherServer(t, serverOptions{token: "tok", held: 9})
	h := startPusher(t, writeToken(t, "tok"))
	h.p.Sync(testPool, []Target{target("u1", d, 7)}, false)
	h.next(t)
	s := h.p.States(testPool)[0]
	if s.Result != PushConflict || s.HeldVersion != 9 || !errors.Is(s.Err, ErrPushConflict) {
		t.Errorf("state %+v, want a conflict holding 9", s)
	}
	if reqs, _ := d.seen(); !cmp.Equal(reqs, []string{"PUT /v1/policy"}) {
		t.Errorf("requests %v, want one PUT", reqs)
	}
}

// A pool_mismatch records the pool the dispatcher holds and no version,
// so the reconciler does not bump its version over the other pool's; the
// pod is retried with backoff, and a later success forgets the pool.
func TestPusherRecordsTheHeldPool(t *testing.T) {
	d := newDispatcherServer(t, serverOptions{token: "tok", held: 9, heldPool: "ns/other"})
	h := startPusher(t, writeToken(t, "tok"))
	h.p.Sync(testPool, []Target{target("u1", d, 7)}, false)
	h.next(t)
	s := h.p.States(testPool)[0]
	if s.Result != PushPoolMismatch || s.HeldPool != "ns/other" || s.HeldVersion != 0 || s.Failures != 1 || !errors.Is(s.Err, ErrPushPoolMismatch) {
		t.Fatalf("state %+v, want a pool mismatch holding ns/other", s)
	}
	h.expect(t, "u1", pushBackoff)
	d.backend.mu.Lock()
	d.backend.pol = nil // the pod restarted: it holds no pool any more
	d.backend.mu.Unlock()
	h.clk.Step(250 * time.Millisecond)
	h.next(t)
	if s := h.p.States(testPool)[0]; s.Result != PushOK || s.HeldPool != "" || s.AckedVersion != 7 {
		t.Errorf("state %+v, want acked 7 and no held pool", s)
	}
}

// Two pools that select the same pod each have their own key and see
// their own answers: the pool whose policy the pod holds is synced, the
// other one is refused with pool_mismatch, and neither overwrites the
// other's target.
func TestPusherKeepsPoolsApartOnASharedPod(t *testing.T) {
	d := newDispatcherServer(t, serverOptions{token: "tok", held: 1})
	h := startPusher(t, writeToken(t, "tok"))
	other := types.NamespacedName{Namespace: "ns", Name: "q"}
	theirs := target("u1", d, 2)
	theirs.Policy.Pool = "ns/q"
	h.p.Sync(testPool, []Target{target("u1", d, 2)}, false)
	h.p.Sync(other, []Target{theirs}, false)
	h.next(t)
	h.next(t)
	mine, refused := h.p.States(testPool), h.p.States(other)
	if len(mine) != 1 || mine[0].Result != PushOK || mine[0].AckedVersion != 2 {
		t.Errorf("the pod's own pool: %+v, want acked 2", mine)
	}
	if len(refused) != 1 || refused[0].Result != PushPoolMismatch || refused[0].HeldPool != "ns/p" {
		t.Errorf("the other pool: %+v, want a pool mismatch naming ns/p", refused)
	}
	if p := d.backend.Policy(); p.Pool != "ns/p" || p.Version != 2 {
		t.Errorf("the pod holds %s v%d, want ns/p v2", p.Pool, p.Version)
	}
	h.p.Forget(other)
	if got := len(h.p.States(testPool)); got != 1 {
		t.Errorf("forgetting the other pool dropped this pool's pod too: %d states", got)
	}
}

func TestPusherStopsPushingToRemovedPods(t *testing.T) {
	a, b := newDispatcherServer(t, serverOptions{token: "tok"}), newDispatcherServer(t, serverOptions{token: "tok"})
	h := startPusher(t, writeToken(t, "tok"))
	h.p.Sync(testPool, []Target{target("ua", a, 1), target("ub", b, 1)}, false)
	h.next(t)
	h.next(t)
	h.p.Sync(testPool, []Target{target("ua", a, 2)}, true)
	h.next(t)
	h.expect(t, "ua", pushDone)
	h.expect(t, "ua", pushDone)
	h.expect(t, "ub", pushDone)
	h.idle(t)
	if a.putCount() != 2 || b.putCount() != 1 {
		t.Errorf("PUTs a=%d b=%d, want 2 and 1: the removed pod got pushed to", a.putCount(), b.putCount())
	}
	if got := h.p.States(testPool); len(got) != 1 || got[0].Name != "d-ua" {
		t.Errorf("states %+v, want only d-ua", got)
	}
	h.p.Forget(testPool)
	if got := h.p.States(testPool); len(got) != 0 {
		t.Errorf("states after Forget: %+v", got)
	}
}

// A push in flight to a pod that stops being a target is cancelled, and
// its answer is neither recorded nor notified.
func TestPusherCancelsThePushToARemovedPod(t *testing.T) {
	arrived, cancelled := make(chan struct{}), make(chan struct{})
	hold := func(inner http.Handler) http.Handler {
		return http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
			// The server notices a client gone only once the body is read.
			_, _ = io.Copy(io.Discard, r.Body)
			close(arrived)
			<-r.Context().Done()
			close(cancelled)
		})
	}
	d := newDispatcherServer(t, serverOptions{token: "tok", wrap: hold})
	h := startPusher(t, writeToken(t, "tok"))
	h.p.Sync(testPool, []Target{target("u1", d, 1)}, false)
	<-arrived
	h.p.Sync(testPool, nil, false)
	h.expect(t, "u1", pushDropped)
	<-cancelled
	h.noAttempt(t)
	if got := h.p.States(testPool); len(got) != 0 {
		t.Errorf("states %+v, want none", got)
	}
}

// A key queued again and again while a worker is busy is pushed once,
// with the newest target; a key queued while it is being pushed is looked
// at once more and, being current, not pushed again.
func TestPusherDeduplicatesQueuedPushes(t *testing.T) {
	arrived, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	hold := func(inner http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			once.Do(func() { close(arrived) })
			<-release
			inner.ServeHTTP(w, r)
		})
	}
	a := newDispatcherServer(t, serverOptions{token: "tok", wrap: hold})
	b := newDispatcherServer(t, serverOptions{token: "tok"})
	h := startPusherWith(t, withWorkers(testPusherOptions(writeToken(t, "tok"), 5*time.Second), 1))
	h.p.Sync(testPool, []Target{target("ua", a, 1)}, false)
	<-arrived // the only worker is busy with ua
	for v := int64(1); v <= 3; v++ {
		h.p.Sync(testPool, []Target{target("ua", a, 1), target("ub", b, v)}, false)
	}
	if n := h.queued(); n != 1 {
		t.Fatalf("%d keys queued, want 1 (ub once; ua waits for its push to end)", n)
	}
	close(release)
	h.next(t)
	h.next(t)
	h.expect(t, "ua", pushDone)
	h.expect(t, "ub", pushDone)
	h.expect(t, "ua", pushSkipped)
	h.idle(t)
	if a.putCount() != 1 || b.putCount() != 1 || b.backend.version() != 3 {
		t.Errorf("PUTs a=%d b=%d, b holds v%d; want one each and v3", a.putCount(), b.putCount(), b.backend.version())
	}
}

// gateBoth makes each of two dispatchers hold its request until both
// arrived, or until the push times out.
func gateBoth() func(http.Handler) http.Handler {
	var arrived sync.WaitGroup
	arrived.Add(2)
	both := make(chan struct{})
	go func() { arrived.Wait(); close(both) }()
	return func(inner http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			arrived.Done()
			select {
			case <-both:
			case <-r.Context().Done():
				return
			}
			inner.ServeHTTP(w, r)
		})
	}
}

func TestPusherPushesConcurrently(t *testing.T) {
	// Two pods that each hold their request until both arrived prove the
	// pushes overlap; sequential pushes would never both arrive.
	gate := gateBoth()
	a := newDispatcherServer(t, serverOptions{token: "tok", wrap: gate})
	b := newDispatcherServer(t, serverOptions{token: "tok", wrap: gate})
	h := startPusher(t, writeToken(t, "tok"))
	h.p.Sync(testPool, []Target{target("ua", a, 1), target("ub", b, 1)}, false)
	h.next(t)
	h.next(t)
	for _, s := range h.p.States(testPool) {
		if s.AckedVersion != 1 {
			t.Errorf("%s: %+v, want acked 1 (the pushes did not overlap within the 5s timeout)", s.Name, s)
		}
	}
}

// With one worker the same two pods are pushed one after the other: the
// first waits for the second until its timeout (long enough for the
// second to answer in time on a loaded machine), then the second gets in.
func TestPusherWorkersBoundThePushesInFlight(t *testing.T) {
	gate := gateBoth()
	a := newDispatcherServer(t, serverOptions{token: "tok", wrap: gate})
	b := newDispatcherServer(t, serverOptions{token: "tok", wrap: gate})
	h := startPusherWith(t, withWorkers(testPusherOptions(writeToken(t, "tok"), 2*time.Second), 1))
	h.p.Sync(testPool, []Target{target("ua", a, 1), target("ub", b, 1)}, false)
	h.next(t)
	h.next(t)
	got := map[PushResult]int{}
	for _, s := range h.p.States(testPool) {
		got[s.Result]++
	}
	if diff := cmp.Diff(map[PushResult]int{PushUnreachable: 1, PushOK: 1}, got); diff != "" {
		t.Errorf("results (-want +got):\n%s", diff)
	}
}

func withWorkers(o PusherOptions, n int) PusherOptions {
	o.Workers = n
	return o
}

// A resync asked for while the same version's push to the pod is in
// flight is answered by that push: the pod is looked at once more and,
// being current, not pushed again (it would re-apply what it just
// acknowledged).
func TestPusherAResyncDuringThePushOfItsVersionPushesOnce(t *testing.T) {
	arrived, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	hold := func(inner http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			once.Do(func() { close(arrived) })
			<-release
			inner.ServeHTTP(w, r)
		})
	}
	d := newDispatcherServer(t, serverOptions{token: "tok", wrap: hold})
	h := startPusher(t, writeToken(t, "tok"))
	h.p.Sync(testPool, []Target{target("u1", d, 1)}, false)
	<-arrived
	h.p.Sync(testPool, []Target{target("u1", d, 1)}, true)
	close(release)
	h.next(t)
	h.expect(t, "u1", pushDone)
	h.expect(t, "u1", pushSkipped)
	h.idle(t)
	if got := d.putCount(); got != 1 {
		t.Errorf("PUTs = %d, want 1: the resync came while version 1 was being pushed", got)
	}
	// A resync of a version not in flight pushes, although it is current.
	h.p.Sync(testPool, []Target{target("u1", d, 1)}, true)
	h.next(t)
	h.expect(t, "u1", pushDone)
	if got := d.putCount(); got != 2 {
		t.Errorf("PUTs = %d, want 2 (the push and the later resync)", got)
	}
}
