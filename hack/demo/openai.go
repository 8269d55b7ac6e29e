package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// openaiRetries is the client's retry budget per call.
const openaiRetries = 4

// openaiCall is one Chat.Completions.New call and its HTTP attempts.
type openaiCall struct {
	Stream   string
	Tenant   string
	Start    time.Duration
	End      time.Duration
	Outcome  string // served, refused (retries exhausted), cut, error
	Cause    string
	Attempts []attempt
	// PromptTokens and CompletionTokens are a served call's usage.
	PromptTokens, CompletionTokens int64
	// Paced is how long the worker waited on the rate headers after it.
	Paced time.Duration
}

type attempt struct {
	Start, End time.Duration
	Status     int // 0: no answer came (see Outcome)
	Outcome    string
	Cause      string
	RetryAfter int // seconds, from the refusal
	// Rate is the answer's x-ratelimit-*-tokens headers.
	Rate rateHeaders
}

type callKey struct{}

// callTracker collects a call's attempts from the middleware.
type callTracker struct {
	mu       sync.Mutex
	attempts []attempt
}

func (g *loadGen) openaiWorker(issueCtx, reqCtx context.Context, s streamPlan, worker int) {
	from, to := g.window(s)
	tenant := s.Tenants[worker%len(s.Tenants)]
	c := openai.NewClient(
		option.WithBaseURL("http://"+serviceHost+"/v1/"),
		option.WithHTTPClient(g.client),
		option.WithAPIKey("demo-unused"), // the pool identifies tenants by header
		option.WithHeader(g.header, tenant),
		option.WithMaxRetries(openaiRetries),
		option.WithMiddleware(g.middleware(s, tenant)),
	)
	if !g.sleepUntil(issueCtx, from) {
		return
	}
	params := openai.ChatCompletionNewParams{
		Model:     "sim-model",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(shortPrompt)},
		MaxTokens: openai.Int(16),
	}
	if b := s.Budget; b != nil {
		params.Messages = []openai.ChatCompletionMessageParamUnion{openai.UserMessage(b.prompt())}
		params.MaxTokens = openai.Int(int64(b.MaxTokens))
	}
	for issueCtx.Err() == nil && g.rec.since() < to && g.rec.take() {
		call := g.openaiCall(reqCtx, &c, s.Name, tenant, params)
		more := true
		if b := s.Budget; b != nil {
			call.Paced, more = g.pace(issueCtx, b, call, to)
		}
		g.rec.mu.Lock()
		g.rec.calls = append(g.rec.calls, call)
		g.rec.mu.Unlock()
		if !more {
			return
		}
	}
}

func (g *loadGen) openaiCall(reqCtx context.Context, c *openai.Client, stream, tenant string, params openai.ChatCompletionNewParams) openaiCall {
	tr := &callTracker{}
	ctx, cancel := context.WithTimeout(context.WithValue(reqCtx, callKey{}, tr), g.timeout)
	defer cancel()
	call := openaiCall{Stream: stream, Tenant: tenant, Start: g.rec.since()}
	res, err := c.Chat.Completions.New(ctx, params)
	call.End = g.rec.since()
	if err == nil {
		call.PromptTokens, call.CompletionTokens = res.Usage.PromptTokens, res.Usage.CompletionTokens
	}
	tr.mu.Lock()
	call.Attempts = tr.attempts
	tr.mu.Unlock()
	var apiErr *openai.Error
	switch {
	case err == nil:
		call.Outcome = outcomeServed
	case reqCtx.Err() != nil:
		call.Outcome, call.Cause = outcomeCut, "demo ended"
	case errors.As(err, &apiErr):
		call.Outcome, call.Cause = outcomeRefused, http.StatusText(apiErr.StatusCode)
		if n := len(call.Attempts); n > 0 && call.Attempts[n-1].Cause != "" {
			call.Cause = call.Attempts[n-1].Cause
		}
	default:
		call.Outcome, call.Cause = outcomeError, err.Error()
	}
	return call
}

// middleware records every HTTP attempt of the openai-go client as a
// request of its own (the dispatcher sees each one).
func (g *loadGen) middleware(s streamPlan, tenant string) option.Middleware {
	return func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		tr, _ := req.Context().Value(callKey{}).(*callTracker)
		rec := record{Stream: s.Name, Tenant: tenant, Tier: s.Tier, Client: "openai-go", Start: g.rec.since()}
		g.rec.begin(s.Tier)
		resp, err := next(req)
		var rate rateHeaders
		if resp != nil {
			rate = readRateHeaders(resp.Header)
		}
		finish := func(rec record) {
			rec.End = g.rec.since()
			g.rec.end(rec)
			if tr != nil {
				tr.mu.Lock()
				tr.attempts = append(tr.attempts, attempt{Start: rec.Start, End: rec.End, Status: rec.Status, Outcome: rec.Outcome, Cause: rec.Cause, RetryAfter: rec.RetryAfter, Rate: rate})
				tr.mu.Unlock()
			}
		}
		if err != nil {
			rec.Outcome, rec.Cause = outcomeError, err.Error()
			if req.Context().Err() != nil {
				rec.Outcome, rec.Cause = outcomeCut, "demo ended while queued"
			}
			finish(rec)
			return resp, err
		}
		rec.Status = resp.StatusCode
		if resp.StatusCode != http.StatusOK {
			b, rerr := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			resp.Body = io.NopCloser(bytes.NewReader(b))
			if rerr != nil {
				rec.Outcome, rec.Cause = outcomeError, rerr.Error()
			} else {
				rec.Outcome, rec.Cause, rec.RetryAfter = refusalFrom(resp.StatusCode, resp.Header, b)
			}
			finish(rec)
			return resp, nil
		}
		if w, ok := waitHeader(resp); ok {
			g.rec.wait(waitSample{Tier: s.Tier, Tenant: tenant, Dispatch: rec.Start + w, Wait: w})
		}
		// The answer is read by the client after this returns; the attempt
		// ends when it has been read.
		resp.Body = &endBody{ReadCloser: resp.Body, done: func(err error) {
			if err != nil {
				rec.Outcome, rec.Cause = outcomeError, err.Error()
				if req.Context().Err() != nil {
					rec.Outcome, rec.Cause = outcomeCut, "demo ended while streaming"
				}
			} else {
				rec.Outcome = outcomeServed
			}
			finish(rec)
		}}
		return resp, nil
	}
}

// endBody calls done once: with nil at EOF, or with the read error (or
// errBodyClosedEarly when closed before EOF).
type endBody struct {
	io.ReadCloser
	once sync.Once
	done func(error)
}

var errBodyClosedEarly = errors.New("answer closed before its end")

func (b *endBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if errors.Is(err, io.EOF) {
		b.once.Do(func() { b.done(nil) })
	} else if err != nil {
		b.once.Do(func() { b.done(err) })
	}
	return n, err
}

func (b *endBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(func() { b.done(errBodyClosedEarly) })
	return err
}
