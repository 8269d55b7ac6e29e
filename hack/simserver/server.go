package main

import (
	"encoding/json"
	"net/http"
	"strconv"
	"sync/atomic"

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
	tok          tokenModel
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
	mux.HandleFunc("POST /v1/embeddings", s.embed)
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
