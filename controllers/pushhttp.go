package controllers

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
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
	// known is true when the pod answered; schema is then the revision it
	// declared, and sent the revision the policy was written at.
	known        bool
	schema, sent int
}

// maxAnswer bounds how much of a dispatcher's answer is read.
const maxAnswer = 64 << 10

// push pushes t to a pod that reads policy schema revision rev, and
// classifies the answer.
func (p *Pusher) push(ctx context.Context, t Target, rev int) attempt {
	start := time.Now()
	a := p.pushOnce(ctx, t, rev)
	pushTotal.WithLabelValues(string(a.result)).Inc()
	pushLatency.Observe(time.Since(start).Seconds())
	return a
}

// pushOnce performs the push. A 400 from a pod that declares an older
// revision than the policy was written at (or no revision: an old
// dispatcher refusing fields it does not know) is pushed again at once at
// that revision, within the same timeout.
func (p *Pusher) pushOnce(ctx context.Context, t Target, rev int) attempt {
	tokens, err := p.opts.Tokens.PushTokens()
	if err != nil {
		return attempt{result: PushFailed, err: fmt.Errorf("%w: %v", ErrPushFailed, err)}
	}
	ctx, cancel := context.WithTimeout(ctx, p.opts.Timeout)
	defer cancel()
	a := p.putAt(ctx, t, tokens, rev)
	if a.result == PushRejected && a.known && a.schema < a.sent {
		a = p.putAt(ctx, t, tokens, a.schema)
	}
	return a
}

// putAt sends t's policy written at revision rev: one PUT, its answer
// classified.
func (p *Pusher) putAt(ctx context.Context, t Target, tokens []string, rev int) attempt {
	pol, _ := t.Policy.At(rev)
	body, err := json.Marshal(pol)
	if err != nil {
		return attempt{result: PushFailed, err: fmt.Errorf("%w: encoding policy: %v", ErrPushFailed, err)}
	}
	r, err := p.putWithTokens(ctx, t.Address, tokens, body)
	if err != nil {
		return attempt{result: PushUnreachable, err: fmt.Errorf("%w: %s: %v", ErrPushUnreachable, t.Address, err)}
	}
	a := classify(t, r)
	a.known, a.schema, a.sent = true, r.schema, pol.SchemaVersion
	return a
}

// classify turns an answer into an attempt.
func classify(t Target, r reply) attempt {
	if r.code != http.StatusOK {
		return refused(t, r.code, r.body)
	}
	var ack policy.Ack
	if err := json.Unmarshal(r.body, &ack); err != nil {
		return attempt{result: PushFailed, err: fmt.Errorf("%w: %s answered 200 with an unreadable ack: %v", ErrPushFailed, t.Address, err)}
	}
	if ack.Version != t.Policy.Version {
		return attempt{result: PushFailed, err: fmt.Errorf("%w: %s acknowledged version %d, sent %d", ErrPushFailed, t.Address, ack.Version, t.Policy.Version)}
	}
	return attempt{result: PushOK, ack: ack}
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

// reply is a dispatcher's answer to one PUT.
type reply struct {
	code int
	body []byte // up to maxAnswer bytes
	// schema is the policy schema revision the answer's SchemaHeader
	// declares; 0 when it has none (a dispatcher older than the header) or
	// one that is not a number.
	schema int
}

// put sends one PUT /v1/policy and returns the answer; its body is closed.
func (p *Pusher) put(ctx context.Context, address, token string, body []byte) (reply, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, "http://"+address+"/v1/policy", bytes.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return reply{}, err
	}
	schema, err := strconv.Atoi(resp.Header.Get(policy.SchemaHeader))
	if err != nil || schema < 0 {
		schema = 0
	}
	return reply{code: resp.StatusCode, body: answer, schema: schema}, nil
}

// summarize shortens a dispatcher's answer for a condition message.
func summarize(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 512 {
		s = s[:512] + "…"
	}
	return s
}
