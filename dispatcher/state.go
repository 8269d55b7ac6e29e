package dispatcher

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"sync"

	"github.com/go-logr/logr"

	"github.com/tiergate/tiergate/dispatcher/queue"
)

// StateOpener opens a fleet-mode state backend for a --state URL. kick
// re-runs the queue's dispatch (queue.Kick) and may be called once Serve
// has started, e.g. when another dispatcher released a slot. The Closer is
// closed after the drain.
type StateOpener func(ctx context.Context, stateURL string, kick func(), log logr.Logger) (queue.Gate, io.Closer, error)

var (
	statesMu sync.Mutex
	states   = map[string]StateOpener{}
)

// RegisterState makes --state accept URLs of scheme (e.g. "redis"). Call it
// from an init function.
func RegisterState(scheme string, open StateOpener) {
	statesMu.Lock()
	defer statesMu.Unlock()
	if _, dup := states[scheme]; dup {
		panic("dispatcher: state scheme registered twice: " + scheme)
	}
	states[scheme] = open
}

// OpenState resolves a --state value: "local" (or empty) is local mode and
// returns a nil Gate; a URL uses the opener registered for its scheme.
func OpenState(ctx context.Context, state string, kick func(), log logr.Logger) (queue.Gate, io.Closer, error) {
	if state == "" || state == "local" {
		return nil, nil, nil
	}
	u, err := url.Parse(state)
	if err != nil || u.Scheme == "" {
		return nil, nil, fmt.Errorf("--state must be \"local\" or a URL such as redis://host:6379, got %q", state)
	}
	statesMu.Lock()
	open, ok := states[u.Scheme]
	statesMu.Unlock()
	if !ok {
		return nil, nil, fmt.Errorf("--state: no shared-state backend for scheme %q in this build", u.Scheme)
	}
	return open(ctx, state, kick, log)
}
