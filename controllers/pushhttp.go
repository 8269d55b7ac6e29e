package controllers

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

// attempt is the classified answer to one push.
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
