package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// maxChoices caps n, as maxTokens caps an answer's length.
const maxChoices = 16

// request holds the fields of a completion or embedding request that
// matter here.
type request struct {
	Model               string          `json:"model"`
	Stream              bool            `json:"stream"`
	MaxTokens           int             `json:"max_tokens"`
	MaxCompletionTokens int             `json:"max_completion_tokens"`
	N                   *int            `json:"n"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	Messages            []message       `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	Input               json.RawMessage `json:"input"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// readRequest reads and decodes a request body, answering 400 itself when
// it cannot.
func (s *server) readRequest(w http.ResponseWriter, r *http.Request) (request, bool) {
	var req request
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.maxBodyBytes))
	if err != nil {
		openAIError(w, http.StatusBadRequest, "could not read body: "+err.Error())
		return req, false
	}
	if err := json.Unmarshal(body, &req); err != nil {
		openAIError(w, http.StatusBadRequest, "body is not a JSON completion request: "+err.Error())
		return req, false
	}
	return req, true
}

// plan turns a completion request into the generation to run, or answers
// 400 and returns false.
func (s *server) plan(w http.ResponseWriter, r *http.Request, req request, chat bool) (generation, bool) {
	limit := s.tokens
	if req.MaxCompletionTokens > 0 {
		limit = req.MaxCompletionTokens
	} else if req.MaxTokens > 0 {
		limit = req.MaxTokens
	}
	n := 1
	if req.N != nil {
		n = *req.N
	}
	if n < 1 || n > maxChoices {
		openAIError(w, http.StatusBadRequest, fmt.Sprintf("n must be between 1 and %d, got %d", maxChoices, n))
		return generation{}, false
	}
	size, err := sizeOf(req.Messages, req.Prompt)
	if err != nil {
		openAIError(w, http.StatusBadRequest, "bad prompt: "+err.Error())
		return generation{}, false
	}
	model := req.Model
	if model == "" {
		model = s.model
	}
	g := generation{
		id: fmt.Sprintf("sim-%d", s.seq.Add(1)), created: time.Now().Unix(), model: model, chat: chat,
		limit: min(limit, maxTokens), choices: n, prompt: s.tok.promptTokens(size),
		usage: req.StreamOptions != nil && req.StreamOptions.IncludeUsage,
	}
	g.tokens, g.capped = s.tok.outputTokens(g.limit)
	d, ok := s.serviceTime(w, r)
	if !ok {
		return generation{}, false
	}
	switch {
	case d >= 0:
		g.spread(d)
	case s.tok.timed():
		g.prefill, g.each = s.tok.timing(g.prompt)
	default:
		g.spread(s.dist.Sample())
	}
	return g, true
}

// serviceTime is the test's override from ServiceTimeHeader, or -1 when it
// set none; it answers 400 itself for a bad one.
func (s *server) serviceTime(w http.ResponseWriter, r *http.Request) (time.Duration, bool) {
	h := r.Header.Get(ServiceTimeHeader)
	if h == "" {
		return -1, true
	}
	d, err := time.ParseDuration(h)
	if err != nil || d < 0 {
		openAIError(w, http.StatusBadRequest, ServiceTimeHeader+" is not a duration: "+h)
		return 0, false
	}
	return d, true
}

func (s *server) generate(w http.ResponseWriter, r *http.Request, chat bool) {
	req, ok := s.readRequest(w, r)
	if !ok {
		return
	}
	g, ok := s.plan(w, r, req, chat)
	if !ok {
		return
	}
	s.serve(r, func(ctx context.Context) (int, bool) {
		if req.Stream {
			return g.stream(ctx, w)
		}
		return g.whole(ctx, w)
	}, g.prompt)
}

// serve runs one request through the generation slots and the statistics;
// run returns the completion tokens it delivered and whether it finished
// before its client left.
func (s *server) serve(r *http.Request, run func(context.Context) (int, bool), prompt int) {
	tenant := r.Header.Get(s.tenantHeader)
	if tenant == "" {
		tenant = noTenant
	}
	ctx := r.Context()
	s.stats.arrive(tenant, r.Header.Get("X-Request-Id"))
	generating, cancelled, delivered := false, true, 0
	defer func() {
		// Record the end before the slot can pass to a waiter; released
		// first, the waiter would count itself while this one still
		// counts, and the recorded peaks would read one over --concurrency.
		s.stats.leave(tenant, generating, cancelled, prompt, delivered)
		if generating {
			s.slots.release()
		}
	}()
	if !s.slots.acquire(ctx) {
		return
	}
	generating = true
	s.stats.startGenerating(tenant)
	var done bool
	delivered, done = run(ctx)
	cancelled = !done
}

// generation is one answer being produced.
type generation struct {
	id      string
	created int64
	model   string
	chat    bool
	limit   int  // the request's maximum output tokens per choice
	tokens  int  // the output tokens of each choice
	capped  bool // --output-tokens drew more than limit
	choices int  // n
	prompt  int  // prompt tokens
	usage   bool
	// prefill is the wait before the first token's decode step; each is the
	// time of one decode step.
	prefill, each time.Duration
}

// spread times the answer as --service-time does: d in all, the tokens
// evenly spaced over it.
func (g *generation) spread(d time.Duration) {
	if g.tokens == 0 {
		g.prefill, g.each = d, 0
		return
	}
	g.prefill, g.each = 0, d/time.Duration(g.tokens)
}

func (g generation) total() time.Duration { return g.prefill + time.Duration(g.tokens)*g.each }

// finish is "length" where the answer was cut at the request's maximum
// (only a drawn --output-tokens can be); an answer of exactly its maximum
// ends in "stop", as simserver's answers always have.
func (g generation) finish() string {
	if g.capped {
		return "length"
	}
	return "stop"
}

func (g generation) usageOf(perChoice int) usage {
	return newUsage(g.prompt, perChoice*g.choices)
}

// token is the i-th placeholder token; deterministic so that tests can
// compare a proxied answer with a direct one.
func token(i int) string { return "tok" + strconv.Itoa(i) + " " }

// wait sleeps d unless ctx ends first.
func wait(ctx context.Context, t *time.Timer, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t.Reset(d)
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		t.Stop()
		return false
	}
}

// whole waits the service time and answers in one JSON body. It returns
// the completion tokens delivered and false if the client went away first.
func (g generation) whole(ctx context.Context, w http.ResponseWriter) (int, bool) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	if !wait(ctx, t, g.total()) {
		return 0, false
	}
	var text strings.Builder
	for i := range g.tokens {
		text.WriteString(token(i))
	}
	object := "text_completion"
	if g.chat {
		object = "chat.completion"
	}
	choices := make([]any, g.choices)
	for i := range choices {
		if g.chat {
			choices[i] = map[string]any{"index": i, "message": map[string]any{"role": "assistant", "content": text.String()}, "finish_reason": g.finish()}
		} else {
			choices[i] = map[string]any{"index": i, "text": text.String(), "logprobs": nil, "finish_reason": g.finish()}
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"id": g.id, "object": object, "created": g.created, "model": g.model,
		"choices": choices, "usage": g.usageOf(g.tokens),
	})
	return g.tokens * g.choices, ctx.Err() == nil
}

// stream sends the tokens as SSE events, one per choice per decode step,
// then each choice's finish_reason, the usage when the request asked for
// it (stream_options.include_usage, as OpenAI and vLLM do), and "data:
// [DONE]". It returns the completion tokens delivered and false if the
// client went away first.
func (g generation) stream(ctx context.Context, w http.ResponseWriter) (int, bool) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	paced := g.each > 0 || g.prefill > 0
	send := func(ev []byte) bool {
		if _, err := fmt.Fprintf(w, "data: %s\n\n", ev); err != nil {
			return false
		}
		return !paced || rc.Flush() == nil
	}
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	start := time.Now()
	for i := range g.tokens {
		// Due times from the start, so the pace does not drift.
		due := start.Add(g.prefill + time.Duration(i+1)*g.each)
		if !wait(ctx, t, time.Until(due)) {
			return i * g.choices, false
		}
		for c := range g.choices {
			if !send(g.chunk(c, token(i), i == 0, "")) {
				return i * g.choices, false
			}
		}
	}
	if !wait(ctx, t, time.Until(start.Add(g.total()))) {
		return g.tokens * g.choices, false
	}
	for c := range g.choices {
		if !send(g.chunk(c, "", g.tokens == 0, g.finish())) {
			return g.tokens * g.choices, false
		}
	}
	if g.usage && !send(g.usageChunk()) {
		return g.tokens * g.choices, false
	}
	if _, err := io.WriteString(w, "data: [DONE]\n\n"); err != nil {
		return g.tokens * g.choices, false
	}
	if err := rc.Flush(); err != nil {
		return g.tokens * g.choices, false
	}
	return g.tokens * g.choices, ctx.Err() == nil
}

func (g generation) object() string {
	if g.chat {
		return "chat.completion.chunk"
	}
	return "text_completion"
}

func (g generation) chunk(index int, text string, first bool, finish string) []byte {
	var fr any
	if finish != "" {
		fr = finish
	}
	var choice map[string]any
	if g.chat {
		delta := map[string]any{}
		if first {
			delta["role"] = "assistant"
		}
		if text != "" {
			delta["content"] = text
		}
		choice = map[string]any{"index": index, "delta": delta, "finish_reason": fr}
	} else {
		choice = map[string]any{"index": index, "text": text, "logprobs": nil, "finish_reason": fr}
	}
	ev := map[string]any{"id": g.id, "object": g.object(), "created": g.created, "model": g.model, "choices": []any{choice}}
	if g.usage {
		// OpenAI sends "usage": null on every chunk but the last.
		ev["usage"] = nil
	}
	b, _ := json.Marshal(ev)
	return b
}

// usageChunk is the stream's last chunk: no choices, the whole usage.
func (g generation) usageChunk() []byte {
	b, _ := json.Marshal(map[string]any{
		"id": g.id, "object": g.object(), "created": g.created, "model": g.model,
		"choices": []any{}, "usage": g.usageOf(g.tokens),
	})
	return b
}
