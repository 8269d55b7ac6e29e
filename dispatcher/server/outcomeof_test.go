package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"syscall"
	"testing"

	"github.com/tiergate/tiergate/dispatcher/balancer"
	"github.com/tiergate/tiergate/dispatcher/forward"
)

// TestOutcomeOf: what one attempt's status and error say of the backend's
// health, as the balancer counts it.
func TestOutcomeOf(t *testing.T) {
	noAnswer := func(cause error) error { return fmt.Errorf("%w: %w", forward.ErrNoAnswer, cause) }
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	cases := map[string]struct {
		ctx    context.Context
		status int
		err    error
		want   balancer.Outcome
	}{
		"an answer":                      {status: http.StatusOK, want: balancer.Answered},
		"a 4xx is an answer":             {status: http.StatusTooManyRequests, want: balancer.Answered},
		"a 5xx":                          {status: http.StatusServiceUnavailable, want: balancer.Failed},
		"no connection":                  {err: fmt.Errorf("%w: %w", forward.ErrUnreachable, syscall.ECONNREFUSED), want: balancer.Unreachable},
		"no connection, client gone too": {ctx: cancelled, err: forward.ErrUnreachable, want: balancer.Unreachable},
		"reset before the answer":        {err: noAnswer(syscall.ECONNRESET), want: balancer.Dropped},
		"closed before the answer":       {err: noAnswer(io.EOF), want: balancer.Dropped},
		"closed mid-head":                {err: noAnswer(io.ErrUnexpectedEOF), want: balancer.Dropped},
		"broken pipe sending the body":   {err: noAnswer(syscall.EPIPE), want: balancer.Dropped},
		"aborted":                        {err: noAnswer(syscall.ECONNABORTED), want: balancer.Dropped},
		"a malformed answer":             {err: noAnswer(errors.New(`malformed HTTP status code "x"`)), want: balancer.Failed},
		"no answer in time":              {err: forward.ErrTimeout, want: balancer.Failed},
		"an answer cut after its head":   {status: http.StatusOK, err: fmt.Errorf("%w: %w", forward.ErrCut, io.ErrUnexpectedEOF), want: balancer.Failed},
		"the client left":                {ctx: cancelled, err: noAnswer(context.Canceled), want: balancer.Unknown},
		"the client's body failed":       {err: fmt.Errorf("%w: %w", forward.ErrClientGone, forward.ErrClientBody), want: balancer.Unknown},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ctx := tc.ctx
			if ctx == nil {
				ctx = context.Background()
			}
			if got := outcomeOf(ctx, tc.status, tc.err); got != tc.want {
				t.Errorf("outcomeOf(%d, %v) = %d, want %d", tc.status, tc.err, got, tc.want)
			}
		})
	}
}
