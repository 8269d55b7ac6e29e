package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
)

// TenantHeader is the header tiergate's dispatcher sets to the tenant it
// resolved, after stripping the client's own credentials.
const TenantHeader = "X-Tiergate-Tenant"

// ServiceTimeHeader lets a test ask for one request's service time,
// overriding --service-time (a Go duration such as "2s").
const ServiceTimeHeader = "X-Sim-Service-Time"

// noTenant is the stats key for requests without a tenant header.
const noTenant = "(none)"

// maxTokens caps max_tokens so one request cannot make the server spin.
const maxTokens = 4096

type server struct {
	model        string
	tokens       int
	tenantHeader string
	dist         serviceTime
	slots        *slots
	stats        *stats
	log          logr.Logger
	seq          atomic.Uint64
	maxBodyBytes int64
}

func (s *server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { s.generate(w, r, true) })
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { s.generate(w, r, false) })
	mux.HandleFunc("GET /v1/models", s.models)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /debug/stats", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, http.StatusOK, s.stats.snapshot()) })
	mux.HandleFunc("POST /debug/stats/reset", func(w http.ResponseWriter, _ *http.Request) {
		s.stats.reset()
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

func (s *server) models(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{
		"object": "list",
		"data": []map[string]any{{
			"id": s.model, "object": "model", "created": 0, "owned_by": "tiergate-simserver",
		}},
	})
}

// request holds the fields of a completion request that matter here.
type request struct {
	Model               string `json:"model"`
	Stream              bool   `json:"stream"`
	MaxTokens           int    `json:"max_tokens"`
	MaxCompletionTokens int    `json:"max_completion_tokens"`
}

func (s *server) generate(w http.ResponseWriter, r *http.Request, chat bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.maxBodyBytes))
	if err != nil {
		openAIError(w, http.StatusBadRequest, "could not read body: "+err.Error())
		return
	}
	var req request
	if err := json.Unmarshal(body, &req); err != nil {
		openAIError(w, http.StatusBadRequest, "body is not a JSON completion request: "+err.Error())
		return
	}
	n := s.tokens
	if req.MaxCompletionTokens > 0 {
		n = req.MaxCompletionTokens
	} else if req.MaxTokens > 0 {
		n = req.MaxTokens
	}
	n = min(n, maxTokens)
	d := s.dist.Sample()
	if h := r.Header.Get(ServiceTimeHeader); h != "" {
		if d, err = time.ParseDuration(h); err != nil || d < 0 {
			openAIError(w, http.StatusBadRequest, ServiceTimeHeader+" is not a duration: "+h)
			return
		}
	}
	model := req.Model
	if model == "" {
		model = s.model
	}

	tenant := r.Header.Get(s.tenantHeader)
	if tenant == "" {
		tenant = noTenant
	}
	ctx := r.Context()
	s.stats.arrive(tenant, r.Header.Get("X-Request-Id"))
	generating, cancelled := false, true
	defer func() {
		// Record the end before the slot can pass to a waiter; released
		// first, the waiter would count itself while this one still
		// counts, and the recorded peaks would read one over --concurrency.
		s.stats.leave(tenant, generating, cancelled)
		if generating {
			s.slots.release()
		}
	}()
	if !s.slots.acquire(ctx) {
		return
	}
	generating = true
	s.stats.startGenerating(tenant)

	g := generation{
		id:      fmt.Sprintf("sim-%d", s.seq.Add(1)),
		created: time.Now().Unix(),
		model:   model,
		chat:    chat,
		tokens:  n,
	}
	if req.Stream {
		cancelled = !g.stream(ctx, w, d)
	} else {
		cancelled = !g.whole(ctx, w, d)
	}
}

// generation is one answer being produced.
type generation struct {
	id      string
	created int64
	model   string
	chat    bool
	tokens  int
}

// token is the i-th placeholder token; deterministic so that tests can
// compare a proxied answer with a direct one.
func token(i int) string { return "tok" + strconv.Itoa(i) + " " }

// whole waits the service time and answers in one JSON body. It returns
// false if the client went away first.
func (g generation) whole(ctx context.Context, w http.ResponseWriter, d time.Duration) bool {
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return false
		}
	}
	var text strings.Builder
	for i := range g.tokens {
		text.WriteString(token(i))
	}
	usage := map[string]int{"prompt_tokens": 1, "completion_tokens": g.tokens, "total_tokens": g.tokens + 1}
	var choice map[string]any
	object := "text_completion"
	if g.chat {
		object = "chat.completion"
		choice = map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": text.String()}, "finish_reason": "stop"}
	} else {
		choice = map[string]any{"index": 0, "text": text.String(), "logprobs": nil, "finish_reason": "stop"}
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"id": g.id, "object": object, "created": g.created, "model": g.model,
		"choices": []any{choice}, "usage": usage,
	})
	return ctx.Err() == nil
}

// stream sends the tokens as SSE events spread evenly over d, then a final
// event with finish_reason and "data: [DONE]". It returns false if the
// client went away first.
func (g generation) stream(ctx context.Context, w http.ResponseWriter, d time.Duration) bool {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	var interval time.Duration
	var tick *time.Ticker
	if g.tokens > 0 && d > 0 {
		interval = d / time.Duration(g.tokens)
		tick = time.NewTicker(max(interval, time.Microsecond))
		defer tick.Stop()
	}
	for i := 0; i <= g.tokens; i++ {
		if tick != nil && i < g.tokens {
			select {
			case <-tick.C:
			case <-ctx.Done():
				return false
			}
		}
		var ev []byte
		if i < g.tokens {
			ev = g.chunk(token(i), i == 0, "")
		} else {
			ev = g.chunk("", false, "stop")
		}
		if _, err := fmt.Fprintf(w, "data: %s\n\n", ev); err != nil {
			return false
		}
		if tick != nil {
			if err := rc.Flush(); err != nil {
				return false
			}
		}
	}
	if _, err := io.WriteString(w, "data: [DONE]\n\n"); err != nil {
		return false
	}
	if err := rc.Flush(); err != nil {
		return false
	}
	return ctx.Err() == nil
}

func (g generation) chunk(text string, first bool, finish string) []byte {
	var fr any
	if finish != "" {
		fr = finish
	}
	var choice map[string]any
	object := "text_completion"
	if g.chat {
		object = "chat.completion.chunk"
		delta := map[string]any{}
		if first {
			delta["role"] = "assistant"
		}
		if text != "" {
			delta["content"] = text
		}
		choice = map[string]any{"index": 0, "delta": delta, "finish_reason": fr}
	} else {
		choice = map[string]any{"index": 0, "text": text, "logprobs": nil, "finish_reason": fr}
	}
	b, _ := json.Marshal(map[string]any{
		"id": g.id, "object": object, "created": g.created, "model": g.model, "choices": []any{choice},
	})
	return b
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
}

// openAIError answers in the error shape OpenAI clients parse.
func openAIError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]any{"error": map[string]any{"message": msg, "type": "invalid_request_error", "code": nil}})
}
