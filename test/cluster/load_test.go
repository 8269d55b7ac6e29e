package cluster

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tiergate/tiergate/internal/testutil"
)

// loadTenants are the tenants of the load, one client each per
// dispatcher: the samples' three quotas and three tenants of the default
// tier. Each client has one request out at a time, so no tenant goes
// past the one running and one queued request every tenant's share
// grants on every dispatcher, and nothing the bounds refuse is sent.
var loadTenants = []string{"acme", "globex", "initech", "walk-in-1", "walk-in-2", "walk-in-3"}

// loadLimit bounds a load's duration whatever the test does.
const loadLimit = 2 * time.Minute

// load sends completions through the dispatchers' data ports with
// openai-go (keep-alive connections, no retries) until stopped.
type load struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	answered int
	failed   map[string]int // "status type" or the error -> count
	examples []string
}

func startLoad(t *testing.T, ds []*testutil.Dispatcher, pause time.Duration) *load {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), loadLimit)
	l := &load{cancel: cancel, failed: map[string]int{}}
	for _, d := range ds {
		for _, tenant := range loadTenants {
			c := openai.NewClient(option.WithBaseURL("http://"+d.Data+"/v1"), option.WithAPIKey("unused"),
				option.WithHeader("X-Tenant-ID", tenant), option.WithMaxRetries(0), option.WithRequestTimeout(40*time.Second))
			l.wg.Go(func() {
				for ctx.Err() == nil {
					l.one(ctx, c, tenant)
					select {
					case <-ctx.Done():
					case <-time.After(pause):
					}
				}
			})
		}
	}
	t.Cleanup(func() { l.stop() })
	return l
}

// one sends a completion and counts its answer. A request the stop cut
// short is not counted: it was not answered nor refused.
func (l *load) one(ctx context.Context, c openai.Client, tenant string) {
	_, err := c.Completions.New(ctx, openai.CompletionNewParams{
		Model: "sim-model", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")}, MaxTokens: openai.Int(2),
	})
	if ctx.Err() != nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err == nil {
		l.answered++
		return
	}
	key := err.Error()
	var apiErr *openai.Error
	if errors.As(err, &apiErr) {
		key = fmt.Sprintf("%d %s", apiErr.StatusCode, http.StatusText(apiErr.StatusCode))
		if typ := apiErr.Type; typ != "" {
			key += " " + typ
		}
	}
	l.failed[key]++
	if len(l.examples) < 10 {
		l.examples = append(l.examples, fmt.Sprintf("%s %s: %v", time.Now().Format("15:04:05.000"), tenant, err))
	}
}

// stop ends the load and waits for its clients. Idempotent.
func (l *load) stop() {
	l.cancel()
	l.wg.Wait()
}

// result is what the load saw: requests answered 200, and the others
// by kind with a few examples.
func (l *load) result() (answered int, failures string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var kinds []string
	for k, n := range l.failed {
		kinds = append(kinds, fmt.Sprintf("%d × %s", n, k))
	}
	sort.Strings(kinds)
	if len(kinds) == 0 {
		return l.answered, ""
	}
	return l.answered, strings.Join(kinds, ", ") + "; e.g. " + strings.Join(l.examples, " | ")
}

// failures are the requests not answered 200, by kind.
func (l *load) failures() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.failed)
}
