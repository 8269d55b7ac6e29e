package dispatcher

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// exchange is one HTTP round trip as a client's transport saw it.
type exchange struct {
	reused  bool   // on a connection that had served a request before
	to      string // the dispatcher's data address
	code    int    // 0: a transport error
	closing bool   // the answer said Connection: close
	err     string
}

// recorder is a client transport that notes every round trip, openai-go's
// retries included: whether the connection was reused, where it went and
// what came back.
type recorder struct {
	base *http.Transport
	mu   sync.Mutex
	log  []exchange
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	var x exchange
	trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
		x.reused = info.Reused
		x.to = info.Conn.RemoteAddr().String()
	}}
	resp, err := r.base.RoundTrip(req.WithContext(httptrace.WithClientTrace(req.Context(), trace)))
	if err != nil {
		x.err = err.Error()
	} else {
		x.code, x.closing = resp.StatusCode, resp.Close
	}
	r.mu.Lock()
	r.log = append(r.log, x)
	r.mu.Unlock()
	return resp, err
}

// service plays a Kubernetes Service in front of the dispatchers: new
// connections go to the current endpoint, which the test moves when the
// draining dispatcher's readiness fails. Connections already open stay
// where they are, as with kube-proxy.
type service struct{ endpoint atomic.Pointer[string] }

func (s *service) dial(ctx context.Context, network, _ string) (net.Conn, error) {
	return (&net.Dialer{}).DialContext(ctx, network, *s.endpoint.Load())
}

// keepAliveClient is one client with one pooled keep-alive connection.
func (s *service) keepAliveClient() *recorder {
	return &recorder{base: &http.Transport{DialContext: s.dial, MaxIdleConnsPerHost: 1, IdleConnTimeout: time.Minute}}
}

// 30 clients hold keep-alive connections to dispatcher A when it gets
// SIGTERM. From then on A closes idle connections and says Connection:
// close on every answer, so no client sends another request on an old
// connection to A: none gets a 503 on a reused connection. Its next
// connection goes through the "Service" to B once A's readyz fails; in
// the moment before, a fresh connection may still reach A and get 503
// draining, which the client retries after Retry-After. Ten clients are
// openai-go, which retries by itself; twenty are plain loops that honour
// Retry-After.
func TestDrainMovesKeepAliveClients(t *testing.T) {
	s := startSim(t, "--concurrency", "64", "--service-time", "const:20ms")
	pol := basePolicy(1, 64, s.Addr)
	a := startDispatcher(t, dispOpts{policy: pol, args: []string{"--drain-timeout", "5s"}})
	b := startDispatcher(t, dispOpts{policy: pol})
	svc := &service{}
	svc.endpoint.Store(&a.Data)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	recs := make([]*recorder, 30)
	for i := range recs {
		recs[i] = svc.keepAliveClient()
		wg.Add(1)
		go func() {
			defer wg.Done()
			tenant := fmt.Sprintf("client-%02d", i)
			if i < 10 {
				openaiLoop(stop, recs[i], tenant)
			} else {
				plainLoop(stop, recs[i], tenant)
			}
		}()
	}

	time.Sleep(time.Second) // every client on a warm keep-alive connection to A
	if err := a.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	sigterm := time.Now()
	for !outOfService(a.AdminURL("/readyz")) {
		time.Sleep(5 * time.Millisecond)
	}
	svc.endpoint.Store(&b.Data) // the endpoint controller removes A
	moved := time.Since(sigterm)
	if exited, err := a.Wait(10 * time.Second); !exited || err != nil {
		t.Fatalf("A exited %v: %v", exited, err)
	}
	time.Sleep(1500 * time.Millisecond) // Retry-After: 1, then B
	close(stop)
	wg.Wait()

	tally := tallyDrain(recs, a.Data, b.Data)
	t.Logf("drain of A with 30 keep-alive clients (10 openai-go): %s; A out of the Service %s after SIGTERM", tally, moved.Round(time.Millisecond))
	if tally.reused503 != 0 {
		t.Errorf("%d requests got a 503 on a reused connection, want 0", tally.reused503)
	}
	if tally.draining503WithoutClose != 0 {
		t.Errorf("%d of A's 503s came without Connection: close", tally.draining503WithoutClose)
	}
	if tally.fromB == 0 || tally.clientsOnB != 30 {
		t.Errorf("%d clients reached B (%d answers), want all 30", tally.clientsOnB, tally.fromB)
	}
}

// drainTally counts the round trips of a drain.
type drainTally struct {
	total, fromA, fromB, clientsOnB int
	reused503, fresh503, reusedErr  int
	draining503WithoutClose         int
	closedByA                       int
	errs                            map[string]int
}

func (d drainTally) String() string {
	return fmt.Sprintf("%d round trips (%d to A, %d to B); 503 on a reused connection: %d; 503 on a fresh connection to A: %d; "+
		"transport errors on a reused connection: %d %v; answers of A with Connection: close: %d",
		d.total, d.fromA, d.fromB, d.reused503, d.fresh503, d.reusedErr, d.errs, d.closedByA)
}

func tallyDrain(recs []*recorder, aAddr, bAddr string) drainTally {
	d := drainTally{errs: map[string]int{}}
	for _, r := range recs {
		r.mu.Lock()
		onB := false
		for _, x := range r.log {
			d.total++
			switch x.to {
			case aAddr:
				d.fromA++
			case bAddr:
				d.fromB++
				onB = onB || x.code == http.StatusOK
			}
			switch {
			case x.code == http.StatusServiceUnavailable && x.reused:
				d.reused503++
			case x.code == http.StatusServiceUnavailable:
				d.fresh503++
			case x.code == 0 && x.reused && !strings.Contains(x.err, context.Canceled.Error()):
				d.reusedErr++ // not the clients' own cancellation at the end
				d.errs[x.err]++
			}
			if x.code == http.StatusServiceUnavailable && !x.closing {
				d.draining503WithoutClose++
			}
			if x.to == aAddr && x.closing {
				d.closedByA++
			}
		}
		if onB {
			d.clientsOnB++
		}
		r.mu.Unlock()
	}
	return d
}

// plainLoop posts completions until stop, one at a time, waiting out
// Retry-After on a 503.
func plainLoop(stop <-chan struct{}, rec *recorder, tenant string) {
	c := &http.Client{Transport: rec}
	for {
		select {
		case <-stop:
			return
		default:
		}
		req, _ := http.NewRequest(http.MethodPost, "http://tiergate.invalid/v1/completions", strings.NewReader(`{"model":"m","prompt":"hi","max_tokens":2}`))
		req.Header.Set("X-Tenant-ID", tenant)
		resp, err := c.Do(req)
		if err != nil {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusServiceUnavailable {
			secs, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(secs) * time.Second):
			}
		}
	}
}

// openaiLoop makes completions with openai-go until stop; the client
// retries 503s after Retry-After by itself.
func openaiLoop(stop <-chan struct{}, rec *recorder, tenant string) {
	c := openai.NewClient(
		option.WithBaseURL("http://tiergate.invalid/v1"),
		option.WithAPIKey("unused-in-trusted-header-mode"),
		option.WithHeader("X-Tenant-ID", tenant),
		option.WithHTTPClient(&http.Client{Transport: rec}),
		option.WithMaxRetries(5),
	)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-stop; cancel() }()
	for ctx.Err() == nil {
		_, _ = c.Completions.New(ctx, openai.CompletionNewParams{
			Model: "sim-model", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")}, MaxTokens: openai.Int(2),
		})
	}
}

// outOfService reports whether a readiness probe at url fails: 503, or the
// admin port already closed (a drain with nothing left to finish can end
// between two probes).
func outOfService(url string) bool {
	resp, err := http.Get(url)
	if err != nil {
		return true
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusServiceUnavailable
}
